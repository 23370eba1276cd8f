public import Foundation
public import OrchardSupport
public import Logging
public import ServiceLifecycle

/// The contract every Orchard scheduler offers: BGTaskScheduler's, with an async handler.
public protocol BackgroundTaskScheduling: Sendable {
    /// Registers the handler launched for `identifier`; must happen before the scheduler starts.
    func register(identifier: String, handler: @escaping BackgroundTaskHandler) async throws(SchedulerError)
    /// Submits a request; one with the same identifier replaces the pending one.
    func submit(_ request: TaskRequest) async throws(SchedulerError)
    /// Cancels the pending request with this identifier (a running task is not affected, but is not retried).
    func cancel(identifier: String) async
    /// Cancels every pending request.
    func cancelAll() async
    /// The requests waiting to run.
    func pendingRequests() async -> [TaskRequest]
}

/// How a ``BackgroundScheduler`` behaves; every field has a default.
public struct SchedulerConfiguration: Sendable {
    /// The identifiers that may be registered and submitted (iOS: `BGTaskSchedulerPermittedIdentifiers`).
    public var permittedIdentifiers: Set<String>
    /// The most app-refresh requests pending at once (iOS: 1).
    public var maxPendingAppRefresh: Int
    /// The most processing requests pending at once (iOS: 10).
    public var maxPendingProcessing: Int
    /// An app-refresh run's budget, and the window the service opens for refresh tasks (iOS: about 30 s).
    public var appRefreshBudget: Duration
    /// A processing run's budget, and the window the service opens for processing tasks.
    public var processingBudget: Duration
    /// How long an expired task has to finish before it is marked overran and throttled.
    public var overrunGrace: Duration
    /// The throttle after an overrun: `base` for the first, multiplied per further consecutive overrun, capped.
    public var throttle: RetryPolicy
    /// How often required conditions are re-checked during a run.
    public var conditionPollInterval: Duration
    /// How often the service re-checks conditions while tasks wait on them.
    public var idlePollInterval: Duration
    /// How competing tasks are chosen.
    public var policy: SchedulingPolicy
    /// Thresholds and the unknown-reading rule for constraints.
    public var rules: ConditionRules

    /// Creates a configuration.
    public init(
        permittedIdentifiers: Set<String> = [],
        maxPendingAppRefresh: Int = 1,
        maxPendingProcessing: Int = 10,
        appRefreshBudget: Duration = .seconds(30),
        processingBudget: Duration = .seconds(300),
        overrunGrace: Duration = .seconds(5),
        throttle: RetryPolicy = RetryPolicy(base: .seconds(900), multiplier: 2, cap: .seconds(24 * 3600)),
        conditionPollInterval: Duration = .seconds(5),
        idlePollInterval: Duration = .seconds(60),
        policy: SchedulingPolicy = SchedulingPolicy(),
        rules: ConditionRules = ConditionRules()
    ) {
        self.permittedIdentifiers = permittedIdentifiers
        self.maxPendingAppRefresh = maxPendingAppRefresh
        self.maxPendingProcessing = maxPendingProcessing
        self.appRefreshBudget = appRefreshBudget
        self.processingBudget = processingBudget
        self.overrunGrace = overrunGrace
        self.throttle = throttle
        self.conditionPollInterval = conditionPollInterval
        self.idlePollInterval = idlePollInterval
        self.policy = policy
        self.rules = rules
    }

    /// The per-run budget for a kind.
    public func budget(for kind: TaskKind) -> Duration {
        kind == .appRefresh ? appRefreshBudget : processingBudget
    }

    /// The pending limit for a kind.
    public func pendingLimit(for kind: TaskKind) -> Int {
        kind == .appRefresh ? maxPendingAppRefresh : maxPendingProcessing
    }
}

/// One run in a window.
public struct RunRecord: Sendable, Hashable {
    /// The task identifier.
    public var identifier: String
    /// Its kind.
    public var kind: TaskKind
    /// How it ended.
    public var outcome: RunOutcome
    /// Its run time, from its own start.
    public var runTime: Duration
    /// The time limit it was given.
    public var timeLimit: Duration
    /// Why it was expired, if it was.
    public var expiredBy: ExpirationReason?
    /// When it is due again (retry, repeat, or re-queue), if it was re-queued by the scheduler.
    public var nextBeginDate: Date?
    /// Set when the run throttled the identifier.
    public var throttledUntil: Date?
}

/// Why a pending task did not run in a window.
public struct DeferralReason: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: Sendable, Hashable {
        case notDue(Date), throttled(Date), unmet([UnmetConstraint]), noHandler, doesNotFit(Duration), otherKind
    }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Its earliest begin date is later.
    public static func notDue(until date: Date) -> DeferralReason { .init(.notDue(date)) }
    /// Its identifier is throttled after an overrun.
    public static func throttled(until date: Date) -> DeferralReason { .init(.throttled(date)) }
    /// Required conditions are not met.
    public static func unmet(_ constraints: [UnmetConstraint]) -> DeferralReason { .init(.unmet(constraints)) }
    /// No handler is registered for it.
    public static let noHandler = DeferralReason(.noHandler)
    /// Its estimate does not fit what was left of the window.
    public static func doesNotFit(estimate: Duration) -> DeferralReason { .init(.doesNotFit(estimate)) }
    /// The window was for another kind.
    public static let otherKind = DeferralReason(.otherKind)

    /// The unmet constraints, when that is the reason.
    public var unmetConstraints: [UnmetConstraint] {
        if case .unmet(let list) = kind { return list }
        return []
    }

    /// Whether the task was not yet due (or throttled).
    public var isWaitingForTime: Bool {
        switch kind {
        case .notDue, .throttled: true
        default: false
        }
    }

    public var description: String {
        switch kind {
        case .notDue(let date): "not due until \(date)"
        case .throttled(let date): "throttled until \(date)"
        case .unmet(let list): "unmet: " + list.map(\.description).joined(separator: ", ")
        case .noHandler: "no handler registered"
        case .doesNotFit(let estimate): "estimate \(estimate) does not fit the window"
        case .otherKind: "window is for another kind"
        }
    }
}

/// What happened in one window.
public struct WindowReport: Sendable, Hashable {
    /// The window's budget.
    public var budget: Duration
    /// The time the window's runs took.
    public var used: Duration
    /// The runs, in order.
    public var runs: [RunRecord]
    /// The pending tasks that did not run, and why (as of the window's end).
    public var deferred: [String: DeferralReason]
    /// Store errors met while recording runs (each also logged).
    public var storeErrors: [SchedulerError]
}

/// Orchard's background task scheduler: BGTaskScheduler's contract, Selene's policy done right, real device conditions.
///
/// On Linux it *is* the scheduler: run it as a swift-service-lifecycle `Service`, or drive windows explicitly
/// with ``runWindow(budget:kinds:)`` (the simulator does). Time comes from the injected wall clock (Orchard's one
/// model of time: `SystemClock` on a device, `ManualClock` in tests and simulations); its instants are the dates of
/// earliest-begin and persistence.
public actor BackgroundScheduler: BackgroundTaskScheduling, Service {
    /// The configuration.
    public nonisolated let configuration: SchedulerConfiguration
    /// Set when the store found an unreadable file at open and moved it aside.
    public nonisolated let storeRecovery: StoreRecovery?
    private let clock: any WallClock
    private let conditions: any DeviceConditionsProvider
    private let store: any SchedulerStore
    private let logger: Logger

    private var handlers: [String: BackgroundTaskHandler] = [:]
    private var started = false
    private var pending: [String: PendingTask]
    private var histories: [String: TaskHistory]
    private var running: Set<String> = []
    private var cancelledWhileRunning: Set<String> = []
    private var windowInProgress = false

    /// Creates a scheduler and loads its store.
    /// - Parameters:
    ///   - configuration: limits, budgets, policy and rules.
    ///   - clock: the wall clock runs are timed and slept on, and dates read from. `SystemClock` reads the system's
    ///     date, so a change of the device's clock (a time-zone-free NTP step) lengthens or shortens a window's budget
    ///     by the step; the sleeps themselves are measured on the monotonic clock.
    ///   - conditions: where device conditions come from.
    ///   - store: where pending requests and histories persist.
    ///   - logger: where the scheduler logs.
    public init(
        configuration: SchedulerConfiguration = SchedulerConfiguration(),
        clock: any WallClock = SystemClock(),
        conditions: any DeviceConditionsProvider,
        store: any SchedulerStore = InMemorySchedulerStore(),
        logger: Logger = Logger(label: "orchard.scheduler")
    ) throws(SchedulerError) {
        self.configuration = configuration
        self.clock = clock
        self.conditions = conditions
        self.store = store
        self.logger = logger
        let snapshot = try store.load()
        self.pending = snapshot.pending
        self.histories = snapshot.histories
        self.storeRecovery = store.recovery
        if let recovery = store.recovery {
            logger.error("scheduler store set aside", metadata: ["path": "\(recovery.setAsidePath)", "reason": "\(recovery.reason)"])
        }
    }

    // MARK: Time

    /// The current date, as the scheduler's clock sees it.
    public nonisolated var now: Date { clock.now.date }

    /// The date `delay` from now: handy for `earliestBeginDate` (e.g. a server's `retry_after`).
    public nonisolated func date(after delay: Duration) -> Date { now.addingTimeInterval(delay.inSeconds) }

    private nonisolated func date(of instant: WallInstant) -> Date { instant.date }

    private nonisolated func instant(of date: Date) -> WallInstant { WallInstant(date) }

    // MARK: Contract

    /// Registers the handler launched for `identifier`.
    public func register(identifier: String, handler: @escaping BackgroundTaskHandler) throws(SchedulerError) {
        guard !started else {
            throw SchedulerError(
                .registrationClosed, "cannot register '\(identifier)': the scheduler has started (register before start, as iOS requires before launch ends)")
        }
        guard configuration.permittedIdentifiers.contains(identifier) else {
            throw SchedulerError(.notPermitted, "'\(identifier)' is not in the scheduler's permitted identifiers")
        }
        guard handlers[identifier] == nil else {
            throw SchedulerError(.alreadyRegistered, "a handler is already registered for '\(identifier)'")
        }
        handlers[identifier] = handler
    }

    /// Closes registration; the service calls it, and so should code that drives windows itself.
    public func start() {
        started = true
    }

    /// Submits a request, replacing a pending one with the same identifier.
    public func submit(_ request: TaskRequest) throws(SchedulerError) {
        try request.validate()
        guard configuration.permittedIdentifiers.contains(request.identifier) else {
            throw SchedulerError(.notPermitted, "'\(request.identifier)' is not in the scheduler's permitted identifiers")
        }
        if let timeout = request.timeout, timeout > configuration.budget(for: request.kind) {
            throw SchedulerError(
                .invalidRequest,
                "request '\(request.identifier)': timeout \(timeout) exceeds the \(request.kind) budget \(configuration.budget(for: request.kind))")
        }
        let sameKind = pending.values.filter { $0.request.kind == request.kind && $0.request.identifier != request.identifier }.count
        let limit = configuration.pendingLimit(for: request.kind)
        guard sameKind < limit else {
            throw SchedulerError(.tooManyPendingRequests, "cannot submit '\(request.identifier)': \(limit) \(request.kind) request(s) already pending")
        }
        let task = PendingTask(request: request, submittedAt: now)
        try store.savePending(task)
        pending[request.identifier] = task
        cancelledWhileRunning.remove(request.identifier)
    }

    /// Cancels the pending request with this identifier; a running task is not retried or repeated.
    public func cancel(identifier: String) {
        let isRunning = running.contains(identifier)
        if isRunning { cancelledWhileRunning.insert(identifier) }
        // A running task's request is still stored (until its run ends): cancelled, it goes too.
        guard pending.removeValue(forKey: identifier) != nil || isRunning else { return }
        do { try store.removePending(identifier) } catch {
            logger.error("cannot remove pending request from store", metadata: ["identifier": "\(identifier)", "error": "\(error)"])
        }
    }

    /// Cancels every pending request (running tasks are not retried or repeated).
    public func cancelAll() {
        cancelledWhileRunning.formUnion(running)
        pending.removeAll()
        do { try store.removeAllPending() } catch {
            logger.error("cannot clear pending requests in store", metadata: ["error": "\(error)"])
        }
    }

    /// The requests waiting to run, by identifier.
    public func pendingRequests() -> [TaskRequest] {
        pending.values.map(\.request).sorted { $0.identifier < $1.identifier }
    }

    /// The pending tasks with their submission dates, by identifier.
    public func pendingTasks() -> [PendingTask] {
        pending.values.sorted { $0.request.identifier < $1.request.identifier }
    }

    /// The run history of an identifier, if it ever ran.
    public func history(for identifier: String) -> TaskHistory? {
        histories[identifier]
    }

    /// The earliest date a pending task may start: its earliest begin date or its identifier's throttle, whichever is later.
    public func effectiveBeginDate(of identifier: String) -> Date? {
        guard let task = pending[identifier] else { return nil }
        return effectiveBegin(task)
    }

    private func effectiveBegin(_ task: PendingTask) -> Date {
        let begin = task.request.earliestBeginDate ?? task.submittedAt
        guard let throttle = histories[task.request.identifier]?.throttledUntil else { return begin }
        return max(begin, throttle)
    }

    // MARK: Windows

    private struct Classified {
        var candidates: [SchedulingPolicy.Candidate] = []
        var deferred: [String: DeferralReason] = [:]
    }

    private func classify(kinds: [TaskKind], excluding done: Set<String>, conditions snapshot: DeviceConditions, at date: Date) -> Classified {
        var result = Classified()
        for task in pending.values where !done.contains(task.request.identifier) {
            let request = task.request
            let id = request.identifier
            guard kinds.contains(request.kind) else { result.deferred[id] = .otherKind; continue }
            guard handlers[id] != nil else { result.deferred[id] = .noHandler; continue }
            if let throttle = histories[id]?.throttledUntil, throttle > date {
                result.deferred[id] = .throttled(until: throttle)
                continue
            }
            if let begin = request.earliestBeginDate, begin > date {
                result.deferred[id] = .notDue(until: begin)
                continue
            }
            let unmet = configuration.rules.unmet(request.constraints, kind: request.kind, in: snapshot)
            guard unmet.isEmpty else { result.deferred[id] = .unmet(unmet); continue }
            let kindBudget = configuration.budget(for: request.kind)
            result.candidates.append(
                SchedulingPolicy.Candidate(
                    identifier: id,
                    priority: request.priority,
                    eligibleSince: max(task.submittedAt, request.earliestBeginDate ?? task.submittedAt),
                    history: histories[id],
                    expectedDuration: request.expectedDuration,
                    timeLimit: min(request.timeout ?? kindBudget, kindBudget)
                ))
        }
        return result
    }

    /// Runs the eligible tasks of `kinds` that fit a window of `budget`, one after another, and reports.
    ///
    /// Each pick re-plans against what is left of the window; each run's time limit is the smallest of its own
    /// timeout, its kind's budget and the window's remainder.
    public func runWindow(budget: Duration, kinds: [TaskKind] = TaskKind.allKinds) async throws(SchedulerError) -> WindowReport {
        guard !windowInProgress else { throw SchedulerError(.windowInProgress, "a window is already running on this scheduler") }
        windowInProgress = true
        defer { windowInProgress = false }
        started = true

        let windowStart = clock.now
        var report = WindowReport(budget: budget, used: .zero, runs: [], deferred: [:], storeErrors: [])
        var done = Set<String>()
        while !Task.isCancelled {
            let remaining = budget - windowStart.duration(to: clock.now)
            let snapshot = await conditions.currentConditions()
            let date = now
            let classified = classify(kinds: kinds, excluding: done, conditions: snapshot, at: date)
            report.deferred = classified.deferred
            let plan = configuration.policy.plan(classified.candidates, budget: max(remaining, .zero), now: date)
            for task in plan.deferred { report.deferred[task.identifier] = .doesNotFit(estimate: task.estimate) }
            guard remaining > .zero, let next = plan.selected.first, let task = pending[next.identifier] else { break }
            done.insert(next.identifier)
            let record = await execute(task, remaining: remaining, errors: &report.storeErrors)
            report.runs.append(record)
        }
        report.used = windowStart.duration(to: clock.now)
        return report
    }

    private func execute(_ task: PendingTask, remaining: Duration, errors: inout [SchedulerError]) async -> RunRecord {
        let request = task.request
        let id = request.identifier
        guard let handler = handlers[id] else { preconditionFailure("classify only admits registered identifiers") }
        pending.removeValue(forKey: id)
        // The stored request stays until the run's follow-up replaces it (or the run ends with none): a process killed
        // mid-run finds it again at its next start, as though the run had been stopped.
        running.insert(id)
        defer { running.remove(id) }

        let kindBudget = configuration.budget(for: request.kind)
        let limit = min(request.timeout ?? kindBudget, kindBudget, remaining)
        var history = histories[id] ?? TaskHistory(identifier: id)
        let object = BackgroundTask(identifier: id, kind: request.kind, timeLimit: limit, previousFailures: history.consecutiveFailures)
        let start = clock.now
        logger.debug("task launched", metadata: ["identifier": "\(id)", "limit": "\(limit)"])
        let run = TaskRun(task: object, handler: handler)
        let completion = await supervise(run, start: start, limit: limit, request: request)
        let end = clock.now
        let runTime = start.duration(to: end)

        let outcome: RunOutcome
        switch completion?.expiredBy {
        case _ where completion == nil: outcome = .overran
        case .some(.conditionsLost), .some(.shutdown): outcome = .stopped
        case .some: outcome = .expired
        case .none: outcome = completion!.success ? .succeeded : .failed
        }

        let endDate = date(of: end)
        history.runs += 1
        history.lastRunStart = date(of: start)
        history.lastRunEnd = endDate
        history.lastOutcome = outcome
        if outcome != .stopped { history = configuration.policy.recording(runTime, in: history) }
        var throttledUntil: Date?
        if outcome == .succeeded {
            history.consecutiveFailures = 0
            history.consecutiveOverruns = 0
        } else if outcome.isFailure {
            history.failures += 1
            history.consecutiveFailures += 1
            if outcome == .overran {
                history.consecutiveOverruns += 1
                let until = endDate.addingTimeInterval(configuration.throttle.delay(afterFailures: history.consecutiveOverruns).inSeconds)
                history.throttledUntil = until
                throttledUntil = until
                logger.warning("task overran its time limit; throttled", metadata: ["identifier": "\(id)", "until": "\(until)"])
            }
        }
        histories[id] = history
        let saved = history

        var nextBegin: Date?
        var change = PendingChange.unchanged
        if cancelledWhileRunning.remove(id) == nil, pending[id] == nil {
            var next: PendingTask?
            if outcome == .succeeded {
                if let interval = request.repeatInterval {
                    var repeated = request
                    repeated.earliestBeginDate = endDate.addingTimeInterval(interval.inSeconds)
                    next = PendingTask(request: repeated, submittedAt: endDate)
                }
            } else if outcome == .stopped {
                next = task
            } else if request.retry.allowsRetry(afterFailures: history.consecutiveFailures) {
                var retried = request
                retried.earliestBeginDate = endDate.addingTimeInterval(request.retry.delay(afterFailures: history.consecutiveFailures).inSeconds)
                next = PendingTask(request: retried, submittedAt: task.submittedAt)
            }
            if let next {
                pending[id] = next
                nextBegin = next.request.earliestBeginDate
                change = .save(next)
            } else {
                change = .remove
            }
        }
        // The history and the follow-up in one write: a crash between two would leave the finished request to run again.
        let pendingChange = change
        record(&errors) { () throws(SchedulerError) in try store.recordRun(saved, pending: pendingChange) }
        logger.debug("task finished", metadata: ["identifier": "\(id)", "outcome": "\(outcome)", "runTime": "\(runTime)"])
        return RunRecord(
            identifier: id, kind: request.kind, outcome: outcome, runTime: runTime, timeLimit: limit,
            expiredBy: completion?.expiredBy ?? object.expirationReason, nextBeginDate: nextBegin, throttledUntil: throttledUntil
        )
    }

    private func record(_ errors: inout [SchedulerError], _ write: () throws(SchedulerError) -> Void) {
        do { try write() } catch {
            logger.error("scheduler store write failed", metadata: ["error": "\(error)"])
            errors.append(error)
        }
    }

    private enum Wake: Sendable { case completed(TaskCompletion), timer, cancelled }

    /// Waits for the run to complete, expiring it at its time limit or when its conditions are lost.
    /// Returns `nil` when the task ignored expiry past the grace period.
    private func supervise(_ run: TaskRun, start: WallInstant, limit: Duration, request: TaskRequest) async -> TaskCompletion? {
        let deadline = start.advanced(by: limit)
        var nextPoll = start.advanced(by: configuration.conditionPollInterval)
        let needsPolling = !request.constraints.isEmpty || request.kind == .processing
        var expiredAt = deadline
        while true {
            let wake = needsPolling ? min(nextPoll, deadline) : deadline
            expiredAt = wake
            switch await race(run, until: wake) {
            case .completed(let completion):
                return completion
            case .cancelled:
                run.expire(.shutdown)
                return await finishOnShutdown(run, expiredAt: clock.now)
            case .timer:
                if clock.now >= deadline {
                    run.expire(.timeLimit)
                } else {
                    let snapshot = await conditions.currentConditions()
                    if configuration.rules.allows(request.constraints, kind: request.kind, in: snapshot) {
                        nextPoll = nextPoll.advanced(by: configuration.conditionPollInterval)
                        continue
                    }
                    logger.info("required conditions lost mid-run; expiring", metadata: ["identifier": "\(request.identifier)"])
                    run.expire(.conditionsLost)
                }
            }
            break
        }
        // The grace period counts from the instant the expiry was decided, not from when this line runs.
        switch await race(run, until: expiredAt.advanced(by: configuration.overrunGrace)) {
        case .completed(let completion): return completion
        case .timer: return nil
        case .cancelled: return await finishOnShutdown(run, expiredAt: clock.now)
        }
    }

    /// The scheduler is shutting down (its own task is cancelled) and has expired the run: the handler still
    /// gets the grace period to save its work and call `setTaskCompleted`, as at any expiry, so a daemon does
    /// not exit under a task that is writing its checkpoint. The wait runs in a task of its own, which the
    /// shutdown's cancellation does not reach.
    private func finishOnShutdown(_ run: TaskRun, expiredAt: WallInstant) async -> TaskCompletion {
        let deadline = expiredAt.advanced(by: configuration.overrunGrace)
        let wake = await Task { await self.race(run, until: deadline) }.value
        if case .completed(let completion) = wake { return completion }
        logger.warning("task did not finish within the grace period after shutdown", metadata: ["identifier": "\(run.task.identifier)"])
        return run.task.completion ?? TaskCompletion(success: false, expiredBy: .shutdown)
    }

    private nonisolated func race(_ run: TaskRun, until deadline: WallInstant) async -> Wake {
        if let completion = run.task.completion { return .completed(completion) }
        let clock = self.clock
        return await withTaskGroup(of: Wake.self) { group in
            group.addTask {
                if let completion = await run.waitForCompletion() { return .completed(completion) }
                return .cancelled
            }
            group.addTask {
                if clock.now >= deadline { return .timer }
                do {
                    try await clock.sleep(until: deadline, tolerance: nil)
                    return .timer
                } catch {
                    return .cancelled
                }
            }
            let first = await group.next() ?? .cancelled
            group.cancelAll()
            if case .cancelled = first, let completion = run.task.completion { return .completed(completion) }
            return first
        }
    }

    // MARK: Service

    /// Runs windows whenever tasks are eligible, until cancelled or gracefully shut down.
    public func run() async throws {
        start()
        try await cancelWhenGracefulShutdown { try await self.serviceLoop() }
    }

    private func serviceLoop() async throws {
        while !Task.isCancelled {
            let snapshot = await conditions.currentConditions()
            let date = now
            var ranSomething = false
            for kind in TaskKind.allKinds {
                let eligible = classify(kinds: [kind], excluding: [], conditions: snapshot, at: date)
                guard !eligible.candidates.isEmpty else { continue }
                do {
                    let report = try await runWindow(budget: configuration.budget(for: kind), kinds: [kind])
                    ranSomething = ranSomething || !report.runs.isEmpty
                } catch {
                    logger.debug("service window skipped", metadata: ["error": "\(error)"])
                }
            }
            if ranSomething { continue }
            var wake = clock.now.advanced(by: configuration.idlePollInterval)
            for task in pending.values where handlers[task.request.identifier] != nil {
                let begin = instant(of: effectiveBegin(task))
                if begin > clock.now { wake = min(wake, begin) }
            }
            if clock.now < wake { try await clock.sleep(until: wake, tolerance: nil) }
        }
        throw CancellationError()
    }
}
