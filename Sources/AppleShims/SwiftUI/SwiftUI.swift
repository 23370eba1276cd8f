// The part of SwiftUI that Orchard's example app uses, for Linux: an `App` with a `WindowGroup` of text, and
// `UIApplicationDelegateAdaptor`. The example imports it as `SwiftUI` (Package.swift aliases the module on Linux), so
// the app's Swift is compiled here as an iPhone compiles it. Declarations are transcribed from the SDK's
// `SwiftUI.swiftmodule` interface; see docs/apple-shims.md.
//
// `App.main()` simulates a launch as UIKit performs it: the app value is created (with its delegate adaptor), the
// delegate's `application(_:didFinishLaunchingWithOptions:)` runs, the launch ends (BGTaskScheduler registration is
// closed from then on), and the scene's body is built. Nothing is drawn.
#if os(Linux)  // Apple platforms have the real framework
@_exported public import UIKitShim
@_spi(AppleShimTesting) import BackgroundTasksShim

/// `View`: a piece of user interface.
@MainActor @preconcurrency
public protocol View {
    /// The view's content.
    associatedtype Body: View
    /// The view's content.
    @ViewBuilder var body: Body { get }
}

extension Never: View {
    /// A primitive view has no body.
    public var body: Never { fatalError("a primitive view has no body") }
}

/// `Text`: a view that shows a string.
public struct Text: View {
    nonisolated let content: String
    /// A text view of `content`.
    nonisolated public init(_ content: String) { self.content = content }
    /// A primitive view.
    public var body: Never { fatalError("a primitive view has no body") }
}

/// `VStack`: views arranged vertically.
public struct VStack<Content: View>: View {
    let content: Content
    /// A vertical stack.
    public init(alignment: HorizontalAlignment = .center, spacing: Double? = nil, @ViewBuilder content: () -> Content) { self.content = content() }
    /// A primitive view.
    public var body: Never { fatalError("a primitive view has no body") }
}

/// `HorizontalAlignment`.
public struct HorizontalAlignment: Sendable, Equatable {
    let id: Int
    /// Leading edges aligned.
    public static let leading = HorizontalAlignment(id: 0)
    /// Centers aligned.
    public static let center = HorizontalAlignment(id: 1)
}

/// `TupleView`: several views from a view builder.
public struct TupleView<T>: View {
    /// The views.
    public let value: T
    /// A tuple of views.
    public init(_ value: T) { self.value = value }
    /// A primitive view.
    public var body: Never { fatalError("a primitive view has no body") }
}

/// `ViewBuilder`: builds views from closures.
@MainActor @resultBuilder
public enum ViewBuilder {
    /// One view.
    public static func buildBlock<Content: View>(_ content: Content) -> Content { content }
    /// Two views.
    public static func buildBlock<C0: View, C1: View>(_ c0: C0, _ c1: C1) -> TupleView<(C0, C1)> { TupleView((c0, c1)) }
    /// Three views.
    public static func buildBlock<C0: View, C1: View, C2: View>(_ c0: C0, _ c1: C1, _ c2: C2) -> TupleView<(C0, C1, C2)> { TupleView((c0, c1, c2)) }
}

/// `Scene`: a part of an app's user interface with a life cycle the system manages.
@MainActor @preconcurrency
public protocol Scene {
    /// The scene's content.
    associatedtype Body: Scene
    /// The scene's content.
    @SceneBuilder var body: Body { get }
}

/// `SceneBuilder`: builds scenes from closures.
@MainActor @resultBuilder
public enum SceneBuilder {
    /// One scene.
    public static func buildBlock<Content: Scene>(_ content: Content) -> Content { content }
}

/// `WindowGroup`: a scene that presents a group of identically structured windows.
public struct WindowGroup<Content: View>: Scene {
    let content: Content
    /// A window group of `content`.
    public init(@ViewBuilder content: () -> Content) { self.content = content() }
    /// A primitive scene.
    public var body: Never { fatalError("a primitive scene has no body") }
}

extension Never: Scene {}

/// `App`: the structure and behaviour of an app.
@MainActor @preconcurrency
public protocol App {
    /// The app's scenes.
    associatedtype Body: Scene
    /// The app's scenes.
    @SceneBuilder var body: Body { get }
    /// Creates the app (SwiftUI does, once, at launch).
    init()
}

extension App {
    /// The app's entry point: a launch as UIKit performs it (see the file's comment).
    @MainActor
    public static func main() {
        let app = Self()
        if let delegate = UIApplication.shared.delegate {
            _ = delegate.application(UIApplication.shared, didFinishLaunchingWithOptions: nil)
        }
        BGTaskScheduler.shared.finishLaunching()
        _ = app.body
    }
}

/// `UIApplicationDelegateAdaptor`: gives a SwiftUI app an app delegate (created once, by SwiftUI).
@MainActor @preconcurrency @propertyWrapper
public struct UIApplicationDelegateAdaptor<DelegateType: NSObject & UIApplicationDelegate> {
    /// The delegate SwiftUI created.
    public let wrappedValue: DelegateType

    /// Creates the delegate (once for the app) and makes it the application's delegate.
    public init(_ delegateType: DelegateType.Type = DelegateType.self) {
        if let existing = UIApplication.shared.delegate as? DelegateType {
            wrappedValue = existing
        } else {
            let delegate = DelegateType()
            UIApplication.shared.delegate = delegate
            wrappedValue = delegate
        }
    }
}
#endif
