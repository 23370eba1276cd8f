public import Foundation
import OrchardSupport

/// How a run ended, from the scheduler's side.
public struct RunOutcome: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable, Codable { case succeeded, failed, expired, stopped, overran }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// The task completed with success before its time limit.
    public static let succeeded = RunOutcome(.succeeded)
    /// The task completed with failure (or threw); it is retried with backoff.
    public static let failed = RunOutcome(.failed)
    /// The task reached its time limit and stopped within the grace period; it is retried with backoff.
    public static let expired = RunOutcome(.expired)
    /// A required condition was lost mid-run (or the scheduler shut down); re-queued without penalty.
    public static let stopped = RunOutcome(.stopped)
    /// The task ignored expiry past the grace period: failed, and its identifier is throttled.
    public static let overran = RunOutcome(.overran)

    /// Whether the outcome counts as a failed attempt.
    public var isFailure: Bool { kind == .failed || kind == .expired || kind == .overran }

    /// The outcome's name.
    public var description: String { kind.rawValue }

    public init(from decoder: any Decoder) throws {
        let name = try decoder.singleValueContainer().decode(String.self)
        guard let kind = Kind(rawValue: name) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "unknown run outcome '\(name)'"))
        }
        self.kind = kind
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(kind.rawValue)
    }
}

/// What the scheduler remembers about one identifier across runs and restarts.
public struct TaskHistory: Sendable, Hashable, Codable {
    /// The task identifier.
    public var identifier: String
    /// The most recent measured run times, oldest first, each measured from that run's own start.
    public var recentRunTimes: [Duration]
    /// When the last run started.
    public var lastRunStart: Date?
    /// When the last run ended.
    public var lastRunEnd: Date?
    /// How the last run ended.
    public var lastOutcome: RunOutcome?
    /// Every run so far.
    public var runs: Int
    /// Every failed run so far.
    public var failures: Int
    /// Failed runs since the last success; drives the backoff.
    public var consecutiveFailures: Int
    /// Overruns since the last success; drives the throttle.
    public var consecutiveOverruns: Int
    /// The identifier may not start before this date (set after an overrun, as iOS does).
    public var throttledUntil: Date?

    /// Creates an empty history.
    public init(identifier: String) {
        self.identifier = identifier
        self.recentRunTimes = []
        self.runs = 0
        self.failures = 0
        self.consecutiveFailures = 0
        self.consecutiveOverruns = 0
    }

    private enum CodingKeys: String, CodingKey {
        case identifier, recentRunTimesSeconds, lastRunStart, lastRunEnd, lastOutcome, runs, failures
        case consecutiveFailures, consecutiveOverruns, throttledUntil
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        identifier = try c.decode(String.self, forKey: .identifier)
        recentRunTimes = try c.decode([Double].self, forKey: .recentRunTimesSeconds).map { .seconds($0) }
        lastRunStart = try c.decodeIfPresent(Date.self, forKey: .lastRunStart)
        lastRunEnd = try c.decodeIfPresent(Date.self, forKey: .lastRunEnd)
        lastOutcome = try c.decodeIfPresent(RunOutcome.self, forKey: .lastOutcome)
        runs = try c.decode(Int.self, forKey: .runs)
        failures = try c.decode(Int.self, forKey: .failures)
        consecutiveFailures = try c.decode(Int.self, forKey: .consecutiveFailures)
        consecutiveOverruns = try c.decode(Int.self, forKey: .consecutiveOverruns)
        throttledUntil = try c.decodeIfPresent(Date.self, forKey: .throttledUntil)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(identifier, forKey: .identifier)
        try c.encode(recentRunTimes.map(\.inSeconds), forKey: .recentRunTimesSeconds)
        try c.encodeIfPresent(lastRunStart, forKey: .lastRunStart)
        try c.encodeIfPresent(lastRunEnd, forKey: .lastRunEnd)
        try c.encodeIfPresent(lastOutcome, forKey: .lastOutcome)
        try c.encode(runs, forKey: .runs)
        try c.encode(failures, forKey: .failures)
        try c.encode(consecutiveFailures, forKey: .consecutiveFailures)
        try c.encode(consecutiveOverruns, forKey: .consecutiveOverruns)
        try c.encodeIfPresent(throttledUntil, forKey: .throttledUntil)
    }
}

/// Which of several eligible tasks run in one window: Selene's idea, with its flaws fixed.
///
/// - **Score** = `priority / 5 × (1 + min(waited, agingCap) / agingAnchor)`: priority and the time a task has
///   been eligible, normalised against fixed anchors rather than against the other tasks, so a new task starts
///   at `priority / 5` (never zero) and a low-priority task overtakes a fresh high-priority one after waiting
///   long enough (priority 1 equals a fresh priority 5 after 4 anchors).
/// - **Estimate** = moving average of the last `historyLength` run times, each measured from the task's own start
///   (not the window's), or the request's `expectedDuration`, or `defaultEstimate`; never more than the task's time
///   limit. A measured estimate halves every `estimateHalfLife` since the last run, so a task that once overran
///   is eventually tried again instead of never fitting.
/// - **Fit**: tasks by descending score (ties by identifier), each taken if its estimate fits the remaining budget;
///   a task that does not fit does not stop smaller ones behind it.
public struct SchedulingPolicy: Sendable, Hashable {
    /// Waiting this long adds the task's base score once more.
    public var agingAnchor: Duration
    /// Waiting counts up to this long.
    public var agingCap: Duration
    /// How many recent run times the moving average keeps (Selene's N).
    public var historyLength: Int
    /// The estimate for a task with neither history nor `expectedDuration`.
    public var defaultEstimate: Duration
    /// A measured estimate halves after this long without a run.
    public var estimateHalfLife: Duration

    /// Creates a policy; defaults: 1 h anchor, 24 h cap, N = 3, 10 s default estimate, 6 h half-life.
    public init(
        agingAnchor: Duration = .seconds(3600),
        agingCap: Duration = .seconds(24 * 3600),
        historyLength: Int = 3,
        defaultEstimate: Duration = .seconds(10),
        estimateHalfLife: Duration = .seconds(6 * 3600)
    ) {
        self.agingAnchor = agingAnchor
        self.agingCap = agingCap
        self.historyLength = max(1, historyLength)
        self.defaultEstimate = defaultEstimate
        self.estimateHalfLife = estimateHalfLife
    }

    /// One eligible task, as the policy sees it.
    public struct Candidate: Sendable, Hashable {
        /// The task identifier.
        public var identifier: String
        /// Its priority.
        public var priority: TaskPriorityLevel
        /// Since when it has been eligible (the later of its submission and its earliest begin date).
        public var eligibleSince: Date
        /// Its measured history, if any.
        public var history: TaskHistory?
        /// The request's initial estimate.
        public var expectedDuration: Duration?
        /// The most this task may run in one go (its own timeout or its kind's budget).
        public var timeLimit: Duration

        /// Creates a candidate.
        public init(
            identifier: String, priority: TaskPriorityLevel, eligibleSince: Date, history: TaskHistory? = nil, expectedDuration: Duration? = nil,
            timeLimit: Duration
        ) {
            self.identifier = identifier
            self.priority = priority
            self.eligibleSince = eligibleSince
            self.history = history
            self.expectedDuration = expectedDuration
            self.timeLimit = timeLimit
        }
    }

    /// A candidate with its score and estimate.
    public struct Ranked: Sendable, Hashable {
        /// The task identifier.
        public var identifier: String
        /// Its score.
        public var score: Double
        /// Its expected run time.
        public var estimate: Duration
    }

    /// The policy's decision for one budget.
    public struct Plan: Sendable, Hashable {
        /// The tasks to run, in order; their estimates sum to at most the budget.
        public var selected: [Ranked]
        /// The tasks that did not fit, by descending score.
        public var deferred: [Ranked]
    }

    /// The candidate's score at `now`.
    public func score(_ candidate: Candidate, now: Date) -> Double {
        let waited = max(0, now.timeIntervalSince(candidate.eligibleSince))
        let aging = min(waited, agingCap.inSeconds) / agingAnchor.inSeconds
        return Double(candidate.priority.rawValue) / 5 * (1 + aging)
    }

    /// The candidate's expected run time at `now`.
    public func estimate(_ candidate: Candidate, now: Date) -> Duration {
        let base: Duration
        if let history = candidate.history, !history.recentRunTimes.isEmpty {
            let recent = history.recentRunTimes.suffix(historyLength)
            let mean = recent.reduce(0.0) { $0 + $1.inSeconds } / Double(recent.count)
            let idle = history.lastRunEnd.map { max(0, now.timeIntervalSince($0)) } ?? 0
            base = .seconds(mean * pow(0.5, idle / estimateHalfLife.inSeconds))
        } else {
            base = candidate.expectedDuration ?? defaultEstimate
        }
        return min(base, candidate.timeLimit)
    }

    /// Ranks the candidates and fits them greedily into `budget`.
    public func plan(_ candidates: [Candidate], budget: Duration, now: Date) -> Plan {
        let ranked =
            candidates
            .map { Ranked(identifier: $0.identifier, score: score($0, now: now), estimate: estimate($0, now: now)) }
            .sorted { $0.score != $1.score ? $0.score > $1.score : $0.identifier < $1.identifier }
        var remaining = budget
        var plan = Plan(selected: [], deferred: [])
        for task in ranked {
            if task.estimate <= remaining {
                plan.selected.append(task)
                remaining -= task.estimate
            } else {
                plan.deferred.append(task)
            }
        }
        return plan
    }

    /// `history` with one more measured run time, keeping the last `historyLength`.
    public func recording(_ runTime: Duration, in history: TaskHistory) -> TaskHistory {
        var history = history
        history.recentRunTimes.append(runTime)
        if history.recentRunTimes.count > historyLength {
            history.recentRunTimes.removeFirst(history.recentRunTimes.count - historyLength)
        }
        return history
    }
}
