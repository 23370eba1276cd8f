// The part of UIKit that Orchard and its example app use, for Linux: `UIDevice`'s battery, the application object and
// its delegate. Orchard's Apple-facing targets import it as `UIKit` (Package.swift aliases the module on Linux).
// Declarations are transcribed from the iOS SDK's UIKit headers (UIDevice.h, UIApplication.h, UIResponder.h) as Swift
// imports them; see docs/apple-shims.md. Also here: `ProcessInfo.thermalState` and `isLowPowerModeEnabled`, which are
// Foundation on Apple platforms (UIKit re-exports it) but missing from Linux's Foundation.
//
// The simulated system's values are set through AppleShimTesting.
#if os(Linux)  // Apple platforms have the real framework
@_exported public import Foundation
import Dispatch

/// The system state the shims report; AppleShimTesting sets it.
@_spi(AppleShimTesting) public struct SimulatedDeviceState: Sendable {
    @_spi(AppleShimTesting) public var thermalState = ProcessInfo.ThermalState.nominal
    @_spi(AppleShimTesting) public var lowPowerMode = false
    @_spi(AppleShimTesting) public var batteryState = UIDevice.BatteryState.unknown
    @_spi(AppleShimTesting) public var batteryLevel: Float = -1
}

/// The simulated device.
@_spi(AppleShimTesting) public let simulatedDevice = SimulatedDeviceLock(SimulatedDeviceState())

/// A lock around the simulated device state.
@_spi(AppleShimTesting) public final class SimulatedDeviceLock: @unchecked Sendable {
    private let lock = NSLock()
    private var value: SimulatedDeviceState
    @_spi(AppleShimTesting) public init(_ value: SimulatedDeviceState) { self.value = value }
    @_spi(AppleShimTesting) public func withLock<T>(_ body: (inout SimulatedDeviceState) -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}

extension ProcessInfo {
    /// `ProcessInfo.ThermalState`.
    public enum ThermalState: Int, Sendable {
        case nominal, fair, serious, critical
    }

    /// The current thermal state of the system.
    public var thermalState: ThermalState { simulatedDevice.withLock { $0.thermalState } }

    /// Whether Low Power Mode is on.
    public var isLowPowerModeEnabled: Bool { simulatedDevice.withLock { $0.lowPowerMode } }
}

/// `UIDevice` (battery monitoring only). Main-actor isolated, as UIKit's classes are.
@MainActor
open class UIDevice: NSObject {
    /// `UIDevice.BatteryState`.
    public enum BatteryState: Int, Sendable {
        case unknown, unplugged, charging, full
    }

    /// The object that represents the current device.
    public static let current = UIDevice()

    /// Whether battery monitoring is enabled; while it is off, the state reads `.unknown` and the level `-1`.
    open var isBatteryMonitoringEnabled = false

    /// The battery state for the device.
    open var batteryState: BatteryState { isBatteryMonitoringEnabled ? simulatedDevice.withLock { $0.batteryState } : .unknown }

    /// The battery charge level for the device, 0…1, or -1 when unknown.
    open var batteryLevel: Float { isBatteryMonitoringEnabled ? simulatedDevice.withLock { $0.batteryLevel } : -1 }

    private override init() {}
}

/// `UIResponder`.
@MainActor
open class UIResponder: NSObject {
    /// Creates a responder.
    public override init() {}
}

/// `UIApplication.LaunchOptionsKey`.
public struct UIApplicationLaunchOptionsKey: Hashable, Sendable, RawRepresentable {
    /// The key's name.
    public let rawValue: String
    /// Creates a key.
    public init(rawValue: String) { self.rawValue = rawValue }
}

/// `UIApplication`: the app's singleton.
@MainActor
open class UIApplication: UIResponder {
    /// `UIApplication.LaunchOptionsKey`.
    public typealias LaunchOptionsKey = UIApplicationLaunchOptionsKey

    /// `UIApplication.State`.
    public enum State: Int, Sendable {
        case active, inactive, background
    }

    /// The app instance.
    public static let shared = UIApplication()

    /// The app's state.
    open var applicationState: State { simulatedApplicationState }

    /// The app's delegate (SwiftUI's `UIApplicationDelegateAdaptor` sets it).
    open var delegate: (any UIApplicationDelegate)?

    @_spi(AppleShimTesting) public var simulatedApplicationState = State.active
}

/// `UIApplicationDelegate`: the methods Orchard's example implements. One difference from UIKit: the shim requires
/// `init()`, which SwiftUI's `UIApplicationDelegateAdaptor` calls through the Objective-C runtime on Apple platforms
/// (Swift on Linux can only call it through a requirement), so a delegate here must be `final` or have a `required init()`.
@MainActor
public protocol UIApplicationDelegate: NSObjectProtocol {
    /// Creates the delegate (SwiftUI does, once, at launch).
    init()
    /// Tells the delegate that launching is almost done.
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool
    /// Tells the delegate that events for a background URL session are waiting; call `completionHandler` when done.
    func application(_ application: UIApplication, handleEventsForBackgroundURLSession identifier: String, completionHandler: @escaping () -> Void)
}

extension UIApplicationDelegate {
    /// Default: launching succeeds.
    public func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool { true }
    /// Default: the events are not handled; the handler is called at once.
    public func application(_ application: UIApplication, handleEventsForBackgroundURLSession identifier: String, completionHandler: @escaping () -> Void) {
        completionHandler()
    }
}
#endif
