// The system's side of the BackgroundTasks shim, for tests: the real framework has no API for any of this (Apple's
// counterpart is the debugger-only `_simulateLaunchForTaskWithIdentifier:`), so it lives here, not in the module that
// stands in for `BackgroundTasks`.
#if os(Linux)  // Apple platforms have the real framework
@_spi(AppleShimTesting) public import BackgroundTasksShim

extension BGTaskScheduler {
    /// What a simulated scheduler does with a programming error that ends a real app.
    public enum ViolationPolicy: Sendable {
        /// End the process, as the uncaught exception does on iOS (assert it with an exit test).
        case trap
        /// Record it in ``simulatedViolations`` and go on (the call fails).
        case record
    }

    /// A scheduler with an app of its own, still launching: `permittedIdentifiers` stands in for Info.plist's
    /// `BGTaskSchedulerPermittedIdentifiers` (`nil`: any).
    public static func simulated(permittedIdentifiers: Set<String>?, violations: ViolationPolicy = .record) -> BGTaskScheduler {
        BGTaskScheduler(permittedIdentifiers: permittedIdentifiers, policy: violations == .trap ? .trap : .record)
    }

    /// The app finishes launching (`application(_:didFinishLaunchingWithOptions:)` returned): registering a launch
    /// handler from now on raises.
    public func simulateFinishLaunching() { finishLaunching() }

    /// Launches the pending request's task as the system does: the app runs (relaunched if suspended), and the launch
    /// handler is called with the task. `nil` if no request is pending or no handler is registered for it.
    @discardableResult
    public func simulateLaunch(forTaskWithIdentifier identifier: String) -> BGTask? { launch(forTaskWithIdentifier: identifier) }

    /// The app enters (or leaves) the foreground: a foreground app is not suspended when its tasks complete.
    public func simulateForeground(_ foreground: Bool) { setForeground(foreground) }

    /// What a real app would not have survived or done: late or duplicate registration, work after suspension,
    /// a task left incomplete at expiry.
    public var simulatedViolations: [String] { state.withLock { $0.violations } }

    /// Whether the app is suspended (its last background task completed while it was not in the foreground).
    public var isSimulatedAppSuspended: Bool { state.withLock { $0.appState == .suspended } }

    /// Whether the system terminated the app (a task not completed at expiry).
    public var isSimulatedAppTerminated: Bool { state.withLock { $0.appState == .terminated } }
}

extension BGTask {
    /// The success the task reported with `setTaskCompleted(success:)`, `nil` until it did.
    public var simulatedCompletion: Bool? { state.withLock { $0.completion } }

    /// The task's time is up: its expiration handler runs once and is cleared; if the task is still not completed
    /// when the handler returns, the app is terminated.
    public func simulateExpiration() { scheduler?.expire(self) }

    /// Waits until the task is completed and returns the success it reported.
    nonisolated(nonsending) public func waitForCompletion() async -> Bool {
        await withCheckedContinuation { continuation in
            let done = state.withLock { s -> Bool? in
                if let completion = s.completion { return completion }
                s.completionWaiters.append(continuation)
                return nil
            }
            if let done { continuation.resume(returning: done) }
        }
    }

    /// Whether the task has an expiration handler set now.
    public var hasExpirationHandler: Bool { state.withLock { $0.expirationHandler != nil } }
}
#endif
