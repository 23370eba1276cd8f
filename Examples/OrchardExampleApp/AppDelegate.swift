#if os(iOS) || os(Linux)
import Foundation
import OrchardClient
import UIKit

/// The app delegate SwiftUI creates (``ExampleApp``'s `@UIApplicationDelegateAdaptor`).
final class AppDelegate: NSObject, UIApplicationDelegate {
    /// The launch is almost done (the BGTaskScheduler identifier was registered in `ExampleApp.init`): start
    /// scheduling, which needs a device token and so goes on asynchronously.
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        Training.shared.start()
        return true
    }

    /// iOS relaunched the app to deliver the background session's events (a model download or a report upload that
    /// finished while the app was suspended): hand the completion handler to the transport, which calls it once the
    /// events are delivered. Another session's events are not Orchard's: complete them at once.
    func application(_ application: UIApplication, handleEventsForBackgroundURLSession identifier: String, completionHandler: @escaping () -> Void) {
        let forwarded = Training.shared.transfers?.handleEventsForBackgroundURLSession(identifier, completionHandler: completionHandler) ?? false
        if !forwarded { completionHandler() }
    }
}
#endif
