// Orchard's example iPhone app: a SwiftUI app that trains a federated model in the background windows iOS grants.
// CI compiles this file on Linux against the shims (Package.swift aliases `SwiftUI`, `UIKit`, `BackgroundTasks` and `os`
// to them), so the Swift here is the Swift an iPhone compiles; the README quotes it.
#if os(iOS) || os(Linux)
import Logging
import OrchardSchedulerApple
import SwiftUI

@main
struct ExampleApp: App {
    // UIKit hands background URL session events to an app delegate, which SwiftUI creates through this adaptor.
    @UIApplicationDelegateAdaptor(AppDelegate.self) private var delegate

    // `init` runs in every launch, background launches included, before the launch ends: register the BGTaskScheduler
    // identifier here (iOS raises for a registration after the launch ended).
    init() {
        LoggingSystem.bootstrap { OSLogHandler(label: $0) }  // Console.app: filter on subsystem dev.orchard
        Training.shared.registerAtLaunch()
    }

    var body: some Scene {
        WindowGroup { StatusView() }
    }
}

/// The app's one screen.
struct StatusView: View {
    var body: some View {
        VStack(alignment: .leading, spacing: 8) {
            Text("Orchard trains this app's model while the phone charges and is online.")
            Text("Open Console.app and filter on subsystem dev.orchard to follow it.")
        }
    }
}
#else
/// macOS has no BGTaskScheduler (and no UIKit): the example is an iPhone app.
@main
enum ExampleApp {
    static func main() { print("OrchardExampleApp is an iPhone app: build it for iOS.") }
}
#endif
