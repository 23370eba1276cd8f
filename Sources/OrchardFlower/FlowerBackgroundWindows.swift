import Foundation
import Logging
import OrchardSupport

public import OrchardScheduler

extension FlowerNode {
    /// Registers the node as a background processing task and submits its first request (unless the scheduler's
    /// store already holds one for this identifier). Each window the scheduler grants runs ``runWindow()``: the node
    /// is active and answers messages until the window expires (its Swift task is cancelled, a training in progress
    /// stops at a batch boundary and its message is kept), then deactivates; the next window is requested
    /// `BackgroundTrainingOptions.defaultInterval` later.
    /// - Parameters:
    ///   - scheduler: The scheduler (register before it starts).
    ///   - options: Identifier, constraints, the interval between windows and the priority.
    ///   - onWindowEnd: Called after each window, with the error that ended it early, if any. A window the SuperLink
    ///     refused (``FlowerError/Code/registrationRefused``) still requests the next one: its operator may register
    ///     the key meanwhile; a failing state directory does not.
    public func scheduleBackgroundWindows(
        on scheduler: any BackgroundTaskScheduling, options: BackgroundTrainingOptions,
        onWindowEnd: @escaping @Sendable (FlowerError?) -> Void = { _ in }
    ) async throws(FlowerError) {
        let logger = configuration.logger
        let interval = Double(options.defaultInterval.components.seconds)
        let clock = self.clock
        @Sendable func request(after delay: Double?) -> TaskRequest {
            .processing(
                options.identifier, earliestBeginDate: delay.map { clock.date.addingTimeInterval($0) }, constraints: options.constraints,
                priority: options.priority
            )
        }
        do {
            try await scheduler.register(identifier: options.identifier) { [self] task in
                task.expirationHandler = { logger.info("flower: background window expired; deactivating", metadata: ["task": "\(task.identifier)"]) }
                do throws(FlowerError) {
                    try await runWindow()
                } catch  where error.code == .storage {
                    // The state directory failed: nothing the next window would do differently by itself.
                    onWindowEnd(error)
                    task.setTaskCompleted(success: false)
                    return
                } catch {
                    // Refused registration or activation (a proxy's 404 during an upgrade, say): the SuperLink or its
                    // operator may admit the node before the next window, so ask for one.
                    onWindowEnd(error)
                    try await scheduler.submit(request(after: interval))
                    task.setTaskCompleted(success: false)
                    return
                }
                onWindowEnd(nil)
                try await scheduler.submit(request(after: interval))
                task.setTaskCompleted(success: true)
            }
            if await !scheduler.pendingRequests().contains(where: { $0.identifier == options.identifier }) {
                try await scheduler.submit(request(after: nil))
            }
        } catch {
            throw FlowerError(.invalidConfiguration, "cannot schedule the Flower node's background windows: \(error)")
        }
    }
}
