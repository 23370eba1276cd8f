// The thin adapter from Orchard's scheduling contract to Apple's BGTaskScheduler. One branch: on iOS, iPadOS and Mac
// Catalyst (the Apple platforms Package.swift declares with BGTaskScheduler) it builds against the real BackgroundTasks
// framework; on Linux against the shim that Package.swift aliases to `BackgroundTasks`. macOS has no BGTaskScheduler
// (its SDK marks the classes unavailable); tvOS and visionOS are not declared platforms, and watchOS has no
// BackgroundTasks framework.
#if os(iOS) || os(Linux)
@preconcurrency public import BackgroundTasks
import Foundation
public import OrchardScheduler
public import OrchardSupport
import Synchronization

/// Forwards ``BackgroundTaskScheduling`` to `BGTaskScheduler`: the OS decides when tasks run; this maps requests,
/// launches the async handler with expiry as Swift task cancellation, forwards `setTaskCompleted`, and re-submits
/// repeating requests after success and failed ones with the request's backoff.
///
/// Registration follows Apple's rules, which end the app when broken: every identifier is registered with
/// ``registerAtLaunch(_:)`` before the app finishes launching, once. ``register(identifier:handler:)`` only attaches
/// the work to an identifier registered that way and throws `registrationClosed` for any other (registering it with the
/// system then would raise). A run's follow-up request is submitted before `setTaskCompleted(success:)` (the system may
/// suspend the app as soon as its last task completes), and at expiry the task is completed at once, before the
/// handler has unwound.
///
/// Limits: BGTaskScheduler cannot express an unmetered-network requirement (submitting one throws `.unsupported`);
/// device idleness is implied for processing tasks (iOS runs them only when the device is idle) and battery-not-low
/// is implied by external power, otherwise `.unsupported`. Priority and estimates are Orchard's policy and are
/// not forwarded: iOS chooses. Failure counts for backoff live in memory only.
public final class AppleBackgroundScheduler: BackgroundTaskScheduling, @unchecked Sendable {
    private let scheduler: BGTaskScheduler
    private let clock: any WallClock
    private let processingTimeLimit: Duration
    private let lock = NSLock()
    private var requests: [String: TaskRequest] = [:]
    private var failures: [String: Int] = [:]
    /// Identifiers registered by ``registerAtLaunch(_:)``, their handlers once attached, and tasks launched before.
    private var preRegistered: Set<String> = []
    private var handlers: [String: BackgroundTaskHandler] = [:]
    private var waitingLaunches: [String: Launch] = [:]

    /// One launch of a system task: waiting for its handler, running it, or ended by the system's expiry. The system
    /// task's one expiration handler, set before the launch is published, acts on whichever state it finds.
    private final class Launch: Sendable {
        enum State {
            case waiting
            case running(TaskRun, report: @Sendable (TaskCompletion) -> Void)
            case expired
        }
        nonisolated(unsafe) let system: BGTask
        let state = Mutex(State.waiting)
        init(_ system: BGTask) { self.system = system }
    }

    /// Creates an adapter.
    /// - Parameters:
    ///   - scheduler: the system scheduler (`BGTaskScheduler.shared`).
    ///   - processingTimeLimit: the time limit reported to processing handlers (iOS grants minutes; refresh: 30 s).
    ///   - clock: the wall clock used to date re-submissions.
    public init(scheduler: BGTaskScheduler = .shared, processingTimeLimit: Duration = .seconds(300), clock: any WallClock = SystemClock()) {
        self.scheduler = scheduler
        self.processingTimeLimit = processingTimeLimit
        self.clock = clock
    }

    /// Registers `identifiers` with BGTaskScheduler now, synchronously: iOS requires every launch handler to be
    /// registered before the app finishes launching (call this from the app's `init` or
    /// `application(_:didFinishLaunchingWithOptions:)`). The work comes later, through
    /// ``register(identifier:handler:)`` — e.g. `FederatedJob.scheduleBackgroundTraining`, which is asynchronous — and
    /// a task the system launches before its handler is attached waits for it (or for its expiry).
    /// - Throws: ``SchedulerError/Code/notPermitted`` when an identifier is not in `BGTaskSchedulerPermittedIdentifiers`
    ///   (Info.plist); ``SchedulerError/Code/alreadyRegistered`` when this adapter registered it already (the system
    ///   would end the app).
    public func registerAtLaunch(_ identifiers: [String]) throws(SchedulerError) {
        for identifier in identifiers {
            let duplicate = lock.withLock { preRegistered.contains(identifier) }
            guard !duplicate else {
                throw SchedulerError(.alreadyRegistered, "'\(identifier)' is already registered with BGTaskScheduler (a second registration ends the app)")
            }
            let registered = scheduler.register(forTaskWithIdentifier: identifier, using: nil) { [weak self] systemTask in
                self?.launched(systemTask)
            }
            guard registered else {
                throw SchedulerError(.notPermitted, "BGTaskScheduler refused '\(identifier)': it is not in Info.plist's BGTaskSchedulerPermittedIdentifiers")
            }
            lock.withLock { _ = preRegistered.insert(identifier) }
        }
    }

    /// Attaches `handler` to an identifier registered with ``registerAtLaunch(_:)``, and runs a task the system
    /// launched while it was missing.
    /// - Throws: ``SchedulerError/Code/registrationClosed`` for an identifier not registered at launch: iOS accepts
    ///   launch handlers only before the app finishes launching, and raises after.
    public func register(identifier: String, handler: @escaping BackgroundTaskHandler) async throws(SchedulerError) {
        let (attached, waiting): (Bool, Launch?) = lock.withLock {
            guard preRegistered.contains(identifier) else { return (false, nil) }
            handlers[identifier] = handler
            return (true, waitingLaunches.removeValue(forKey: identifier))
        }
        guard attached else {
            throw SchedulerError(
                .registrationClosed,
                "'\(identifier)' was not registered at launch: call registerAtLaunch([\"\(identifier)\"]) before the app finishes launching (BGTaskScheduler raises for a later registration)"
            )
        }
        if let waiting { start(waiting, handler: handler) }
    }

    /// The system launched a task of an identifier registered at launch: run its handler, or keep the task until one
    /// is attached. Its expiration handler is set first, once: a task kept waiting and expiring completes
    /// unsuccessfully (its retry submitted first); a running one is expired and completed at once.
    private func launched(_ systemTask: BGTask) {
        let identifier = systemTask.identifier
        let launch = Launch(systemTask)
        systemTask.expirationHandler = { [weak self] in self?.expire(launch) }
        let handler: BackgroundTaskHandler? = lock.withLock {
            if let handler = handlers[identifier] { return handler }
            waitingLaunches[identifier] = launch
            return nil
        }
        if let handler { start(launch, handler: handler) }
    }

    /// Runs `handler` for a launch still waiting; nothing for one the system expired meanwhile.
    private func start(_ launch: Launch, handler: @escaping BackgroundTaskHandler) {
        let system = launch.system
        let identifier = system.identifier
        let kind: TaskKind = system is BGProcessingTask ? .processing : .appRefresh
        let previousFailures = lock.withLock { failures[identifier] ?? 0 }
        let reported = Mutex(false)
        // Once per launch: the follow-up request goes to the system before the task completes, because the system may
        // suspend the app as soon as its last task completes.
        let report: @Sendable (TaskCompletion) -> Void = { [weak self] completion in
            let first = reported.withLock { done in
                defer { done = true }
                return !done
            }
            guard first else { return }
            self?.resubmit(identifier, kind: kind, after: completion)
            launch.system.setTaskCompleted(success: completion.success)
        }
        launch.state.withLock { state in
            guard case .waiting = state else { return }
            let task = BackgroundTask(
                identifier: identifier, kind: kind,
                timeLimit: kind == .processing ? processingTimeLimit : .seconds(30), previousFailures: previousFailures
            )
            task.onCompletion(report)
            state = .running(TaskRun(task: task, handler: handler), report: report)
        }
    }

    /// The system's expiry of a launch. A running handler's expiration handler runs and its Swift task is cancelled,
    /// and the system task is completed at once, unsuccessfully: iOS ends an app whose task is still running when its
    /// expiration handler returns. The handler unwinding later changes nothing.
    private func expire(_ launch: Launch) {
        let previous = launch.state.withLock { state -> Launch.State in
            defer { state = .expired }
            return state
        }
        switch previous {
        case .waiting:
            let identifier = launch.system.identifier
            lock.withLock {
                if waitingLaunches[identifier] === launch { waitingLaunches[identifier] = nil }
            }
            // Submit the retry first: the app may be suspended as soon as the task completes.
            resubmit(
                identifier, kind: launch.system is BGProcessingTask ? .processing : .appRefresh, after: TaskCompletion(success: false, expiredBy: .system))
            launch.system.setTaskCompleted(success: false)
        case .running(let run, let report):
            run.expire(.system)
            report(TaskCompletion(success: false, expiredBy: .system))
        case .expired:
            break
        }
    }

    /// The follow-up of a launch: the next repeat after a success, or the retry after a failure. The system removed the
    /// request when it launched the task, so one this process never submitted (it was pending from an earlier run of
    /// the app) is rebuilt from the launch, with the default retry, rather than nothing being submitted.
    private func resubmit(_ identifier: String, kind: TaskKind, after completion: TaskCompletion) {
        let next: TaskRequest? = lock.withLock {
            var request = requests[identifier] ?? TaskRequest(identifier: identifier, kind: kind)
            if completion.success {
                failures[identifier] = 0
                guard let interval = request.repeatInterval else { return nil }
                request.earliestBeginDate = clock.date.addingTimeInterval(interval.inSeconds)
                return request
            }
            let count = (failures[identifier] ?? 0) + 1
            failures[identifier] = count
            guard request.retry.allowsRetry(afterFailures: count) else { return nil }
            request.earliestBeginDate = clock.date.addingTimeInterval(request.retry.delay(afterFailures: count).inSeconds)
            return request
        }
        if let next { try? submitToSystem(next) }
    }

    /// Submits a request to BGTaskScheduler.
    /// - Throws: ``SchedulerError/Code/registrationClosed`` for an identifier not registered at launch (iOS raises
    ///   `NSInternalInconsistencyException` for a submit without a launch handler; this refuses it first).
    public func submit(_ request: TaskRequest) async throws(SchedulerError) {
        try request.validate()
        guard lock.withLock({ preRegistered.contains(request.identifier) }) else {
            throw SchedulerError(
                .registrationClosed,
                "'\(request.identifier)' has no launch handler: register it with registerAtLaunch(_:) before the app finishes launching, then submit")
        }
        try submitToSystem(request)
    }

    private func submitToSystem(_ request: TaskRequest) throws(SchedulerError) {
        let systemRequest = try Self.systemRequest(for: request)
        do {
            try scheduler.submit(systemRequest)
        } catch let error as BGTaskScheduler.Error {
            switch error.code {
            case .notPermitted: throw SchedulerError(.notPermitted, "'\(request.identifier)' is not in BGTaskSchedulerPermittedIdentifiers")
            case .tooManyPendingTaskRequests: throw SchedulerError(.tooManyPendingRequests, "BGTaskScheduler has too many pending \(request.kind) requests")
            default: throw SchedulerError(.unavailable, "BGTaskScheduler is unavailable: \(error)")
            }
        } catch {
            throw SchedulerError(.unavailable, "BGTaskScheduler refused '\(request.identifier)': \(error)")
        }
        lock.withLock { requests[request.identifier] = request }
    }

    /// The BGTaskScheduler request for an Orchard request; throws `.unsupported` for what iOS cannot express.
    public static func systemRequest(for request: TaskRequest) throws(SchedulerError) -> BGTaskRequest {
        if request.kind == .appRefresh {
            let refresh = BGAppRefreshTaskRequest(identifier: request.identifier)
            refresh.earliestBeginDate = request.earliestBeginDate
            return refresh
        }
        let constraints = request.constraints
        if constraints.requiresUnmeteredNetwork {
            throw SchedulerError(.unsupported, "'\(request.identifier)': BGTaskScheduler cannot require an unmetered network")
        }
        if constraints.requiresBatteryNotLow, !constraints.requiresExternalPower {
            throw SchedulerError(.unsupported, "'\(request.identifier)': BGTaskScheduler cannot require battery-not-low without external power")
        }
        let processing = BGProcessingTaskRequest(identifier: request.identifier)
        processing.earliestBeginDate = request.earliestBeginDate
        processing.requiresExternalPower = constraints.requiresExternalPower
        processing.requiresNetworkConnectivity = constraints.requiresNetworkConnectivity
        return processing
    }

    public func cancel(identifier: String) async {
        scheduler.cancel(taskRequestWithIdentifier: identifier)
        lock.withLock { _ = requests.removeValue(forKey: identifier) }
    }

    public func cancelAll() async {
        scheduler.cancelAllTaskRequests()
        lock.withLock { requests.removeAll() }
    }

    public func pendingRequests() async -> [TaskRequest] {
        let system = await scheduler.pendingTaskRequests()
        let known = lock.withLock { requests }
        let pending = system.map { systemRequest in
            var request =
                known[systemRequest.identifier]
                ?? TaskRequest(
                    identifier: systemRequest.identifier, kind: systemRequest is BGProcessingTaskRequest ? .processing : .appRefresh
                )
            request.earliestBeginDate = systemRequest.earliestBeginDate
            if let processing = systemRequest as? BGProcessingTaskRequest {
                request.constraints.requiresExternalPower = processing.requiresExternalPower
                request.constraints.requiresNetworkConnectivity = processing.requiresNetworkConnectivity
            }
            return request
        }
        // Requests pending from an earlier run of the app are known from now on, so a failed launch of one is retried.
        lock.withLock {
            for request in pending where requests[request.identifier] == nil { requests[request.identifier] = request }
        }
        return pending
    }
}
#endif
