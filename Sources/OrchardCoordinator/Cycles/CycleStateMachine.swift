public import Foundation
public import OrchardProtocol

/// The cycle logic of one FL process as a pure state machine: no I/O, no clock, no randomness of its own.
///
/// The caller feeds it events (a cycle request, a report starting, committing or failing, a timer tick) with
/// the current time and any random inputs, performs the I/O the returned decisions call for, and reports the
/// outcome back (``apply(_:)``). A cycle admits up to ``Configuration/capacity`` devices, closes when the goal
/// is reached or at its deadline, and is then aggregated (if at least the minimum reported) or abandoned; either
/// way the next cycle opens, until the configured number of cycles has completed.
public struct CycleStateMachine: Sendable, Hashable {
    /// The knobs of the state machine, taken from a process's `ServerConfig`.
    public struct Configuration: Sendable, Hashable {
        /// Reports that close a cycle early.
        public var goalCount: Int
        /// Devices admitted per cycle.
        public var capacity: Int
        /// Reports needed at the deadline to aggregate.
        public var minimumReports: Int
        /// Seconds from opening to deadline.
        public var cycleLength: Double
        /// Cycles to complete; 0 means unbounded.
        public var cycles: Int
        /// Seconds over which rejected devices are spread.
        public var paceSteeringWindow: Double
        /// Buffered aggregation, when the process uses it: a cycle is then a buffer of `goalCount` reports with no
        /// deadline, `capacity` bounds the devices training at once (across buffers), `cycleLength` is how long each
        /// admitted device has to report, and unreported assignments carry over into the next buffer.
        public var buffered: Bool

        /// Creates a configuration.
        public init(
            goalCount: Int = 100, capacity: Int = 130, minimumReports: Int = 1, cycleLength: Double = 600, cycles: Int = 0, paceSteeringWindow: Double = 60,
            buffered: Bool = false
        ) {
            self.buffered = buffered
            self.goalCount = goalCount
            self.capacity = capacity
            self.minimumReports = minimumReports
            self.cycleLength = cycleLength
            self.cycles = cycles
            self.paceSteeringWindow = paceSteeringWindow
        }

        /// The configuration a server config implies.
        public init(_ server: ServerConfig) {
            if let buffer = server.bufferedAggregation {
                self.init(
                    goalCount: buffer.bufferSize, capacity: buffer.maxConcurrency, minimumReports: buffer.bufferSize, cycleLength: server.cycleLength,
                    cycles: server.cycles, paceSteeringWindow: server.paceSteeringWindow, buffered: true
                )
                return
            }
            self.init(
                goalCount: server.goalCount, capacity: server.capacity, minimumReports: server.minimumReports,
                cycleLength: server.cycleLength, cycles: server.cycles, paceSteeringWindow: server.paceSteeringWindow
            )
        }
    }

    /// Where the current cycle stands.
    public enum Phase: String, Sendable, Hashable {
        /// Admitting devices and accepting reports.
        case open
        /// Goal reached or deadline passed; waiting for reports still being committed.
        case closing
        /// Aggregation or abandonment is being written; nothing is admitted.
        case transitioning
        /// Every configured cycle has completed.
        case completed
    }

    /// A device's place in the current cycle.
    public struct Assignment: Sendable, Hashable {
        /// How far the device got.
        public enum State: String, Sendable, Hashable {
            /// Admitted; no report yet.
            case assigned
            /// A report is being validated and committed.
            case reporting
            /// Its report was committed.
            case reported
            /// Buffered mode: its time to report passed without a report; it no longer counts as training.
            case expired
        }

        /// The worker.
        public var workerID: String
        /// The key issued to it for this cycle.
        public var requestKey: String
        /// Its progress.
        public var state: State
        /// When it was admitted (buffered mode: it expires `cycleLength` seconds later).
        public var assignedAt: Date

        /// Creates an assignment.
        public init(workerID: String, requestKey: String, state: State = .assigned, assignedAt: Date = Date(timeIntervalSince1970: 0)) {
            self.workerID = workerID
            self.requestKey = requestKey
            self.state = state
            self.assignedAt = assignedAt
        }
    }

    /// The answer to a cycle request.
    public enum CycleDecision: Sendable, Hashable {
        /// Admitted; `isNew` is false when the worker already held this assignment (a repeated request).
        case assigned(Assignment, reportWithin: Double, isNew: Bool)
        /// Turned away; come back after `retryAfter` seconds.
        case rejected(retryAfter: Double, reason: String)
    }

    /// The answer to a report starting.
    public enum ReportDecision: Sendable, Hashable {
        /// The report may be validated and committed for `cycle`.
        case proceed(cycle: Int)
        /// The report is refused.
        case refused(WireErrorCode, String)
        /// Buffered mode: the buffer is being published; the same report is accepted into the next one after `after`
        /// seconds.
        case retry(after: Double, String)
    }

    /// Work the caller must do to close the cycle.
    public enum CycleAction: Sendable, Hashable {
        /// Enough reports: average them, publish the next checkpoint, open the next cycle.
        case aggregate(cycle: Int, reports: Int)
        /// Too few reports at the deadline: discard them and open a fresh cycle on the same checkpoint.
        case abandon(cycle: Int, reports: Int)
    }

    /// A planned transition the caller persists, then applies with ``apply(_:)``.
    public struct Transition: Sendable, Hashable {
        /// The cycle being closed.
        public var closedCycle: Int
        /// Whether it was aggregated (false: abandoned).
        public var aggregated: Bool
        /// The checkpoint the next cycle trains from.
        public var checkpoint: Int
        /// The next cycle, or nil when the process completes.
        public var nextCycle: Int?
        /// When the next cycle opens.
        public var openedAt: Date
        /// The next cycle's deadline.
        public var deadline: Date
    }

    /// The configuration.
    public private(set) var configuration: Configuration
    /// The current cycle's number (1-based).
    public private(set) var cycle: Int
    /// The checkpoint the current cycle trains from.
    public private(set) var checkpoint: Int
    /// When the current cycle opened.
    public private(set) var openedAt: Date
    /// The current cycle's reporting deadline.
    public private(set) var deadline: Date
    /// The current phase.
    public private(set) var phase: Phase
    /// Cycles aggregated so far.
    public private(set) var completedCycles: Int
    /// Cycles abandoned so far.
    public private(set) var abandonedCycles: Int
    /// The current cycle's assignments by worker id.
    public private(set) var assignments: [String: Assignment]
    /// Reports committed in the current cycle.
    public private(set) var reported: Int
    /// Reports being validated or committed.
    public private(set) var reporting: Int
    /// Buffered mode: assignments admitted, not reported and not expired (the devices training now).
    public private(set) var inFlight: Int
    private var workerForKey: [String: String]
    private var previousCycleKeys: Set<String>

    /// Creates (or restores) a state machine.
    /// - Parameters:
    ///   - configuration: The process's knobs.
    ///   - cycle: The open cycle's number.
    ///   - checkpoint: The checkpoint it trains from.
    ///   - openedAt: When it opened; the deadline is `openedAt + cycleLength`.
    ///   - completedCycles: Cycles aggregated before it.
    ///   - abandonedCycles: Cycles abandoned before it.
    ///   - assignments: Its assignments (restored ones in state `reporting` are treated as `assigned`: an
    ///     unacknowledged report was never committed).
    ///   - completed: Whether the process already finished.
    public init(
        configuration: Configuration, cycle: Int = 1, checkpoint: Int = 0, openedAt: Date,
        completedCycles: Int = 0, abandonedCycles: Int = 0, assignments: [Assignment] = [], completed: Bool = false
    ) {
        self.configuration = configuration
        self.cycle = cycle
        self.checkpoint = checkpoint
        self.openedAt = openedAt
        self.deadline = configuration.buffered ? .distantFuture : openedAt.addingTimeInterval(configuration.cycleLength)
        self.phase = completed ? .completed : .open
        self.inFlight = 0
        self.completedCycles = completedCycles
        self.abandonedCycles = abandonedCycles
        self.assignments = [:]
        self.workerForKey = [:]
        self.previousCycleKeys = []
        self.reported = 0
        self.reporting = 0
        for var assignment in assignments {
            if assignment.state == .reporting { assignment.state = .assigned }
            if assignment.state == .reported { reported += 1 }
            if assignment.state == .assigned { inFlight += 1 }
            self.assignments[assignment.workerID] = assignment
            workerForKey[assignment.requestKey] = assignment.workerID
        }
        if phase == .open && reported >= configuration.goalCount { phase = .closing }
    }

    /// How long a rejected device should wait: until the current cycle's deadline (when the next one opens at
    /// the latest), spread by `jitter` (0…1) over the pace-steering window.
    private func retryAfter(now: Date, jitter: Double) -> Double {
        if configuration.buffered {
            // No deadline: a place frees when a training device reports, at a rate nothing here predicts.
            return max(1, (configuration.paceSteeringWindow * (0.5 + min(max(jitter, 0), 1))).rounded(.up))
        }
        let untilDeadline = phase == .open ? max(0, deadline.timeIntervalSince(now)) : 0
        let spread = min(max(jitter, 0), 1) * configuration.paceSteeringWindow
        return (untilDeadline + spread).rounded(.up)
    }

    /// When a device that reported in this cycle should come back for the next one: when the next cycle is expected
    /// to open. That is at once when the cycle has already closed; otherwise the goal's expected arrival at the rate
    /// reports came in so far (`elapsed / reported × (goal − reported)`, at least a second), and never after the
    /// deadline (the next cycle opens then at the latest). Spread by `jitter` (0…1) over a tenth of the estimate, so the reporters do not all
    /// return at once.
    public func nextCycleExpected(now: Date, jitter: Double) -> Double {
        guard phase == .open else { return 0 }
        if configuration.buffered {
            // The next release at the rate reports came in so far (none yet: the pace-steering window), at most the
            // time an admitted device has to report.
            let spread = 1 + min(max(jitter, 0), 1) * 0.1
            guard reported > 0 else { return max(1, configuration.paceSteeringWindow * spread).rounded(.up) }
            let elapsed = max(1, now.timeIntervalSince(openedAt))
            let expected = elapsed / Double(reported) * Double(max(0, configuration.goalCount - reported))
            return min(configuration.cycleLength, max(1, expected * spread)).rounded(.up)
        }
        let untilDeadline = max(0, deadline.timeIntervalSince(now))
        guard reported > 0, reported < configuration.goalCount else { return untilDeadline.rounded(.up) }
        // At least a second of history, and at least a second's wait: a burst at the opening predicts nothing.
        let elapsed = max(1, now.timeIntervalSince(openedAt))
        let expected = elapsed / Double(reported) * Double(configuration.goalCount - reported)
        let spread = min(max(jitter, 0), 1) * 0.1 * expected
        return min(untilDeadline, max(1, expected + spread)).rounded(.up)
    }

    /// The seconds a device is told to wait once the process has completed its cycles.
    public static let completedRetryAfter: Double = 86_400

    /// A device asks to join the current cycle.
    /// - Parameters:
    ///   - workerID: The worker.
    ///   - now: The current time.
    ///   - newRequestKey: The key to issue if the worker is admitted (random, from the caller).
    ///   - jitter: A random number in 0…1 spreading `retry_after` over the pace-steering window.
    public mutating func requestCycle(workerID: String, now: Date, newRequestKey: String, jitter: Double) -> CycleDecision {
        switch phase {
        case .completed:
            return .rejected(retryAfter: Self.completedRetryAfter, reason: "process_completed")
        case .closing, .transitioning:
            return .rejected(retryAfter: retryAfter(now: now, jitter: jitter), reason: "cycle_closing")
        case .open:
            break
        }
        if now >= deadline {
            return .rejected(retryAfter: retryAfter(now: now, jitter: jitter), reason: "cycle_closing")
        }
        if configuration.buffered { return requestBuffered(workerID: workerID, now: now, newRequestKey: newRequestKey, jitter: jitter) }
        let remaining = deadline.timeIntervalSince(now)
        if let existing = assignments[workerID] {
            if existing.state == .reported {
                return .rejected(retryAfter: nextCycleExpected(now: now, jitter: jitter), reason: "already_reported")
            }
            return .assigned(existing, reportWithin: remaining, isNew: false)
        }
        guard assignments.count < configuration.capacity else {
            return .rejected(retryAfter: retryAfter(now: now, jitter: jitter), reason: "cycle_full")
        }
        let assignment = Assignment(workerID: workerID, requestKey: newRequestKey)
        assignments[workerID] = assignment
        workerForKey[newRequestKey] = workerID
        return .assigned(assignment, reportWithin: remaining, isNew: true)
    }

    /// Whether a buffered assignment's time to report has passed at `now`.
    /// When `workerID`'s report is due: the cycle's deadline, or (buffered) its assignment's `cycle_length` after it
    /// was given.
    public func reportDeadline(workerID: String) -> Date {
        guard configuration.buffered, let assignment = assignments[workerID] else { return deadline }
        return assignment.assignedAt.addingTimeInterval(configuration.cycleLength)
    }

    private func isExpired(_ assignment: Assignment, now: Date) -> Bool {
        assignment.assignedAt <= now.addingTimeInterval(-configuration.cycleLength)
    }

    /// Marks buffered assignments whose time to report passed as expired, freeing their places.
    private mutating func expireAssignments(now: Date) {
        for (worker, assignment) in assignments where assignment.state == .assigned && isExpired(assignment, now: now) {
            assignments[worker]?.state = .expired
            inFlight -= 1
        }
    }

    /// A buffered check-in: admitted while fewer than `capacity` devices are training, into the open buffer.
    private mutating func requestBuffered(workerID: String, now: Date, newRequestKey: String, jitter: Double) -> CycleDecision {
        if let existing = assignments[workerID] {
            switch existing.state {
            case .reported:
                return .rejected(retryAfter: nextCycleExpected(now: now, jitter: jitter), reason: "already_reported")
            case .expired:
                return .rejected(retryAfter: nextCycleExpected(now: now, jitter: jitter), reason: "assignment_expired")
            case .assigned, .reporting:
                if existing.state == .assigned && isExpired(existing, now: now) {
                    assignments[workerID]?.state = .expired
                    inFlight -= 1
                    return .rejected(retryAfter: nextCycleExpected(now: now, jitter: jitter), reason: "assignment_expired")
                }
                let remaining = existing.assignedAt.addingTimeInterval(configuration.cycleLength).timeIntervalSince(now)
                return .assigned(existing, reportWithin: remaining, isNew: false)
            }
        }
        if inFlight >= configuration.capacity { expireAssignments(now: now) }
        guard inFlight < configuration.capacity else {
            return .rejected(retryAfter: retryAfter(now: now, jitter: jitter), reason: "cycle_full")
        }
        let assignment = Assignment(workerID: workerID, requestKey: newRequestKey, assignedAt: now)
        assignments[workerID] = assignment
        workerForKey[newRequestKey] = workerID
        inFlight += 1
        return .assigned(assignment, reportWithin: configuration.cycleLength, isNew: true)
    }

    /// The worker a request key of the current cycle was issued to.
    public func owner(ofRequestKey key: String) -> String? { workerForKey[key] }

    /// Withdraws a new assignment whose persistence failed.
    public mutating func revokeAssignment(workerID: String) {
        guard let assignment = assignments[workerID], assignment.state == .assigned else { return }
        assignments[workerID] = nil
        workerForKey[assignment.requestKey] = nil
        if configuration.buffered { inFlight -= 1 }
    }

    /// A report arrives; on ``ReportDecision/proceed(cycle:)`` the caller validates and commits it, then calls
    /// ``commitReport(workerID:)`` or ``abortReport(workerID:)``.
    public mutating func beginReport(workerID: String, requestKey: String, now: Date) -> ReportDecision {
        guard let owner = workerForKey[requestKey] else {
            if previousCycleKeys.contains(requestKey) {
                return .refused(.deadlinePassed, "request key belongs to cycle \(cycle - 1), which has closed")
            }
            return .refused(.invalidRequestKey, "request key is not one issued for the current cycle")
        }
        guard owner == workerID, var assignment = assignments[workerID] else {
            return .refused(.invalidRequestKey, "request key was issued to another worker")
        }
        switch assignment.state {
        case .reported:
            return .refused(.reportAlreadyReceived, "a report for this request key was already accepted")
        case .reporting:
            return .refused(.reportAlreadyReceived, "a report for this request key is being processed")
        case .expired:
            return .refused(.deadlinePassed, "the assignment's time to report passed")
        case .assigned:
            break
        }
        if configuration.buffered {
            if isExpired(assignment, now: now) {
                assignments[workerID]?.state = .expired
                inFlight -= 1
                return .refused(.deadlinePassed, "the assignment's time to report passed")
            }
            if phase == .completed { return .refused(.deadlinePassed, "the process completed its releases") }
            guard phase == .open else { return .retry(after: 1, "buffer \(cycle) is being published; send the report again in a moment") }
            // A release holds exactly buffer_size reports (what central privacy's noise and accounting assume): while that
            // many are committed or arriving, another waits for the next buffer.
            guard reported + reporting < configuration.goalCount else {
                return .retry(after: 1, "buffer \(cycle) has all \(configuration.goalCount) of its reports arriving; send the report again in a moment")
            }
        }
        guard phase == .open, now < deadline else {
            return .refused(.deadlinePassed, "cycle \(cycle) stopped accepting reports")
        }
        assignment.state = .reporting
        assignments[workerID] = assignment
        reporting += 1
        return .proceed(cycle: cycle)
    }

    /// A report that began was refused or failed to commit; the worker may report again.
    public mutating func abortReport(workerID: String) -> CycleAction? {
        guard var assignment = assignments[workerID], assignment.state == .reporting else { return nil }
        assignment.state = .assigned
        assignments[workerID] = assignment
        reporting -= 1
        return closeIfReady()
    }

    /// A report that began was committed.
    public mutating func commitReport(workerID: String) -> CycleAction? {
        guard var assignment = assignments[workerID], assignment.state == .reporting else { return nil }
        assignment.state = .reported
        assignments[workerID] = assignment
        reporting -= 1
        reported += 1
        if configuration.buffered { inFlight -= 1 }
        if phase == .open && reported >= configuration.goalCount { phase = .closing }
        return closeIfReady()
    }

    /// Merges assignments that other coordinator instances recorded in a shared store: unknown ones join this view,
    /// and ones reported elsewhere count as reported (one being reported here stays as it is: the store refuses the
    /// second report). Returns the action the merged counts call for.
    public mutating func synchronize(with stored: [Assignment]) -> CycleAction? {
        for incoming in stored {
            if var local = assignments[incoming.workerID] {
                // Expired here but reported elsewhere: the report began before its time ran out on this instance's
                // clock and was committed within the grace. Counted, or the two views never agree again.
                guard local.requestKey == incoming.requestKey, local.state == .assigned || local.state == .expired, incoming.state == .reported else {
                    continue
                }
                let wasInFlight = local.state == .assigned
                local.state = .reported
                assignments[incoming.workerID] = local
                reported += 1
                if configuration.buffered && wasInFlight { inFlight -= 1 }
            } else {
                var adopted = incoming
                if adopted.state == .reporting { adopted.state = .assigned }
                assignments[adopted.workerID] = adopted
                workerForKey[adopted.requestKey] = adopted.workerID
                if adopted.state == .reported { reported += 1 }
                if adopted.state == .assigned && configuration.buffered { inFlight += 1 }
            }
        }
        if phase == .open && reported >= configuration.goalCount { phase = .closing }
        return closeIfReady()
    }

    /// The timer ticked: closes the cycle when its deadline has passed.
    public mutating func timerFired(now: Date) -> CycleAction? {
        if configuration.buffered && phase == .open { expireAssignments(now: now) }
        if phase == .open && now >= deadline { phase = .closing }
        return closeIfReady()
    }

    /// Stops admitting devices and accepting reports now, as though the goal were reached (secure aggregation
    /// resumed past its first stage); closes the cycle when no report is being committed.
    public mutating func closeAdmission() -> CycleAction? {
        if phase == .open { phase = .closing }
        return closeIfReady()
    }

    private mutating func closeIfReady() -> CycleAction? {
        guard phase == .closing, reporting == 0 else { return nil }
        phase = .transitioning
        if reported >= configuration.minimumReports {
            return .aggregate(cycle: cycle, reports: reported)
        }
        return .abandon(cycle: cycle, reports: reported)
    }

    /// The transition to persist after an action: aggregation publishes checkpoint + 1, abandonment keeps it.
    public func plan(_ action: CycleAction, now: Date) -> Transition {
        switch action {
        case .aggregate(let closed, _):
            let finished = configuration.cycles > 0 && completedCycles + 1 >= configuration.cycles
            return Transition(
                closedCycle: closed, aggregated: true, checkpoint: checkpoint + 1, nextCycle: finished ? nil : closed + 1,
                openedAt: now, deadline: nextDeadline(now)
            )
        case .abandon(let closed, _):
            return Transition(
                closedCycle: closed, aggregated: false, checkpoint: checkpoint, nextCycle: closed + 1,
                openedAt: now, deadline: nextDeadline(now)
            )
        }
    }

    private func nextDeadline(_ now: Date) -> Date {
        configuration.buffered ? .distantFuture : now.addingTimeInterval(configuration.cycleLength)
    }

    /// Buffered mode: the assignment times at or before which an assignment is not carried into the next buffer
    /// (expired at the transition); the store carries over exactly those after it.
    public func carryOverCutoff(at now: Date) -> Date? {
        configuration.buffered ? now.addingTimeInterval(-configuration.cycleLength) : nil
    }

    /// Applies a transition once it is persisted. In buffered mode the assignments still training (admitted, not
    /// reported, not expired at the transition's time) carry over into the next buffer with their keys.
    public mutating func apply(_ transition: Transition) {
        precondition(phase == .transitioning && transition.closedCycle == cycle, "transition does not match cycle \(cycle)")
        if transition.aggregated { completedCycles += 1 } else { abandonedCycles += 1 }
        var carried: [String: Assignment] = [:]
        if let cutoff = carryOverCutoff(at: transition.openedAt), transition.nextCycle != nil {
            for (worker, assignment) in assignments where assignment.state == .assigned && assignment.assignedAt > cutoff {
                carried[worker] = assignment
            }
        }
        previousCycleKeys = Set(workerForKey.keys.filter { key in workerForKey[key].map { carried[$0] == nil } ?? true })
        assignments = carried
        workerForKey = Dictionary(uniqueKeysWithValues: carried.values.map { ($0.requestKey, $0.workerID) })
        inFlight = carried.count
        reported = 0
        reporting = 0
        checkpoint = transition.checkpoint
        guard let next = transition.nextCycle else {
            phase = .completed
            return
        }
        cycle = next
        openedAt = transition.openedAt
        deadline = transition.deadline
        phase = .open
    }

    /// Returns to `closing` after a transition failed to persist, so the next tick retries it.
    public mutating func transitionFailed() {
        if phase == .transitioning { phase = .closing }
    }
}
