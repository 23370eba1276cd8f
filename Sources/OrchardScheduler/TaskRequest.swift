public import Foundation
import OrchardSupport

/// The kind of background window a request asks for, mirroring `BGAppRefreshTaskRequest` and `BGProcessingTaskRequest`.
public struct TaskKind: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable, Codable { case appRefresh, processing }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// A short refresh (iOS grants about 30 s).
    public static let appRefresh = TaskKind(.appRefresh)
    /// A longer processing task (minutes), optionally gated on power, network and idleness.
    public static let processing = TaskKind(.processing)

    /// Every kind, refresh first.
    public static let allKinds: [TaskKind] = [.appRefresh, .processing]

    /// The kind's name: `appRefresh` or `processing`.
    public var description: String { kind.rawValue }

    public init(from decoder: any Decoder) throws {
        let name = try decoder.singleValueContainer().decode(String.self)
        guard let kind = Kind(rawValue: name) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "unknown task kind '\(name)'"))
        }
        self.kind = kind
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(kind.rawValue)
    }
}

/// Device conditions a processing request waits for; the first two are BGTaskScheduler's, the rest Orchard's.
public struct TaskConstraints: Sendable, Hashable, Codable {
    /// Run only while on external power (BGProcessingTaskRequest's `requiresExternalPower`).
    public var requiresExternalPower: Bool
    /// Run only with network connectivity (BGProcessingTaskRequest's `requiresNetworkConnectivity`).
    public var requiresNetworkConnectivity: Bool
    /// Run only on an unmetered network (implies connectivity), as WorkManager's `NetworkType.UNMETERED`.
    public var requiresUnmeteredNetwork: Bool
    /// Run only while the CPU is idle, as WorkManager's `requiresDeviceIdle`.
    public var requiresDeviceIdle: Bool
    /// Run only while the battery is not low (or there is no battery), as WorkManager's `requiresBatteryNotLow`.
    public var requiresBatteryNotLow: Bool

    /// Creates constraints; every flag defaults to `false`.
    public init(
        requiresExternalPower: Bool = false,
        requiresNetworkConnectivity: Bool = false,
        requiresUnmeteredNetwork: Bool = false,
        requiresDeviceIdle: Bool = false,
        requiresBatteryNotLow: Bool = false
    ) {
        self.requiresExternalPower = requiresExternalPower
        self.requiresNetworkConnectivity = requiresNetworkConnectivity
        self.requiresUnmeteredNetwork = requiresUnmeteredNetwork
        self.requiresDeviceIdle = requiresDeviceIdle
        self.requiresBatteryNotLow = requiresBatteryNotLow
    }

    /// No constraint.
    public static let none = TaskConstraints()
    /// External power and network: the default for federated training jobs.
    public static let powerAndNetwork = TaskConstraints(requiresExternalPower: true, requiresNetworkConnectivity: true)

    /// Whether no flag is set.
    public var isEmpty: Bool { self == .none }
}

/// How a failed run is retried: exponential backoff from a base, capped, optionally with an attempt limit.
public struct RetryPolicy: Sendable, Hashable, Codable {
    /// The delay after the first failure.
    public var base: Duration
    /// The factor applied per further consecutive failure.
    public var multiplier: Double
    /// The longest delay.
    public var cap: Duration
    /// After this many consecutive failures the request is dropped; `nil` retries forever.
    public var maxAttempts: Int?

    /// Creates a policy; the defaults are WorkManager's: 30 s doubling, capped at 5 hours, unlimited attempts.
    public init(base: Duration = .seconds(30), multiplier: Double = 2, cap: Duration = .seconds(5 * 3600), maxAttempts: Int? = nil) {
        self.base = base
        self.multiplier = multiplier
        self.cap = cap
        self.maxAttempts = maxAttempts
    }

    /// Exponential backoff, 30 s base, 5 h cap.
    public static let exponential = RetryPolicy()
    /// A failed run is not retried.
    public static let never = RetryPolicy(maxAttempts: 0)

    /// The delay before the retry that follows the `failures`-th consecutive failure (1-based).
    public func delay(afterFailures failures: Int) -> Duration {
        guard failures > 0 else { return .zero }
        let seconds = base.inSeconds * pow(multiplier, Double(failures - 1))
        guard seconds.isFinite, seconds < cap.inSeconds else { return cap }
        return .seconds(seconds)
    }

    /// Whether another attempt is allowed after `failures` consecutive failures.
    public func allowsRetry(afterFailures failures: Int) -> Bool {
        guard let maxAttempts else { return true }
        return failures < maxAttempts
    }

    private enum CodingKeys: String, CodingKey { case baseSeconds, multiplier, capSeconds, maxAttempts }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        base = .seconds(try c.decode(Double.self, forKey: .baseSeconds))
        multiplier = try c.decode(Double.self, forKey: .multiplier)
        cap = .seconds(try c.decode(Double.self, forKey: .capSeconds))
        maxAttempts = try c.decodeIfPresent(Int.self, forKey: .maxAttempts)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(base.inSeconds, forKey: .baseSeconds)
        try c.encode(multiplier, forKey: .multiplier)
        try c.encode(cap.inSeconds, forKey: .capSeconds)
        try c.encodeIfPresent(maxAttempts, forKey: .maxAttempts)
    }
}

/// A task's importance when several compete for one window, 1 (lowest) to 5 (highest), as in Selene.
public struct TaskPriorityLevel: Sendable, Hashable, Codable, Comparable, CustomStringConvertible {
    /// The level, 1…5.
    public let rawValue: Int

    /// Creates a level, clamped to 1…5.
    public init(_ rawValue: Int) { self.rawValue = min(5, max(1, rawValue)) }

    /// Level 1.
    public static let veryLow = TaskPriorityLevel(1)
    /// Level 2.
    public static let low = TaskPriorityLevel(2)
    /// Level 3, the default.
    public static let normal = TaskPriorityLevel(3)
    /// Level 4.
    public static let high = TaskPriorityLevel(4)
    /// Level 5.
    public static let veryHigh = TaskPriorityLevel(5)

    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    public var description: String { String(rawValue) }

    public init(from decoder: any Decoder) throws { self.init(try decoder.singleValueContainer().decode(Int.self)) }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(rawValue)
    }
}

/// A request to run a registered task later: BGTaskScheduler's request, plus Orchard's policy fields.
public struct TaskRequest: Sendable, Hashable, Codable {
    /// The registered identifier of the task to launch.
    public var identifier: String
    /// App refresh or processing.
    public var kind: TaskKind
    /// The earliest date the task may start; `nil` means as soon as possible.
    public var earliestBeginDate: Date?
    /// Device conditions to wait for (processing requests only).
    public var constraints: TaskConstraints
    /// The task's priority when several compete for a window.
    public var priority: TaskPriorityLevel
    /// The expected run time before any run has been measured; `nil` uses the policy's default.
    public var expectedDuration: Duration?
    /// This task's own time limit per run; `nil` uses its kind's budget (and never exceeds it).
    public var timeout: Duration?
    /// When set, a successful run re-submits the request to begin this long after the run ended.
    public var repeatInterval: Duration?
    /// How a failed run is retried.
    public var retry: RetryPolicy

    /// Creates a request; prefer ``appRefresh(_:earliestBeginDate:priority:)`` and ``processing(_:earliestBeginDate:constraints:priority:)``.
    public init(
        identifier: String,
        kind: TaskKind,
        earliestBeginDate: Date? = nil,
        constraints: TaskConstraints = .none,
        priority: TaskPriorityLevel = .normal,
        expectedDuration: Duration? = nil,
        timeout: Duration? = nil,
        repeatInterval: Duration? = nil,
        retry: RetryPolicy = .exponential
    ) {
        self.identifier = identifier
        self.kind = kind
        self.earliestBeginDate = earliestBeginDate
        self.constraints = constraints
        self.priority = priority
        self.expectedDuration = expectedDuration
        self.timeout = timeout
        self.repeatInterval = repeatInterval
        self.retry = retry
    }

    /// An app-refresh request (BGAppRefreshTaskRequest).
    public static func appRefresh(_ identifier: String, earliestBeginDate: Date? = nil, priority: TaskPriorityLevel = .normal) -> TaskRequest {
        TaskRequest(identifier: identifier, kind: .appRefresh, earliestBeginDate: earliestBeginDate, priority: priority)
    }

    /// A processing request (BGProcessingTaskRequest) with constraints.
    public static func processing(
        _ identifier: String,
        earliestBeginDate: Date? = nil,
        constraints: TaskConstraints = .none,
        priority: TaskPriorityLevel = .normal
    ) -> TaskRequest {
        TaskRequest(identifier: identifier, kind: .processing, earliestBeginDate: earliestBeginDate, constraints: constraints, priority: priority)
    }

    /// Checks the request's fields against each other.
    public func validate() throws(SchedulerError) {
        guard !identifier.isEmpty else { throw SchedulerError(.invalidRequest, "a task identifier must not be empty") }
        if kind == .appRefresh, !constraints.isEmpty {
            throw SchedulerError(.invalidRequest, "app refresh request '\(identifier)' cannot carry constraints; use a processing request")
        }
        for (name, value) in [("expectedDuration", expectedDuration), ("timeout", timeout), ("repeatInterval", repeatInterval)] {
            if let value, value <= .zero {
                throw SchedulerError(.invalidRequest, "request '\(identifier)': \(name) must be positive, got \(value)")
            }
        }
        guard retry.base >= .zero, retry.cap >= retry.base, retry.multiplier >= 1, (retry.maxAttempts ?? 0) >= 0 else {
            throw SchedulerError(.invalidRequest, "request '\(identifier)': retry policy needs 0 <= base <= cap, multiplier >= 1, maxAttempts >= 0")
        }
    }

    private enum CodingKeys: String, CodingKey {
        case identifier, kind, earliestBeginDate, constraints, priority
        case expectedDurationSeconds, timeoutSeconds, repeatIntervalSeconds, retry
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        identifier = try c.decode(String.self, forKey: .identifier)
        kind = try c.decode(TaskKind.self, forKey: .kind)
        earliestBeginDate = try c.decodeIfPresent(Date.self, forKey: .earliestBeginDate)
        constraints = try c.decode(TaskConstraints.self, forKey: .constraints)
        priority = try c.decode(TaskPriorityLevel.self, forKey: .priority)
        expectedDuration = try c.decodeIfPresent(Double.self, forKey: .expectedDurationSeconds).map { .seconds($0) }
        timeout = try c.decodeIfPresent(Double.self, forKey: .timeoutSeconds).map { .seconds($0) }
        repeatInterval = try c.decodeIfPresent(Double.self, forKey: .repeatIntervalSeconds).map { .seconds($0) }
        retry = try c.decode(RetryPolicy.self, forKey: .retry)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(identifier, forKey: .identifier)
        try c.encode(kind, forKey: .kind)
        try c.encodeIfPresent(earliestBeginDate, forKey: .earliestBeginDate)
        try c.encode(constraints, forKey: .constraints)
        try c.encode(priority, forKey: .priority)
        try c.encodeIfPresent(expectedDuration?.inSeconds, forKey: .expectedDurationSeconds)
        try c.encodeIfPresent(timeout?.inSeconds, forKey: .timeoutSeconds)
        try c.encodeIfPresent(repeatInterval?.inSeconds, forKey: .repeatIntervalSeconds)
        try c.encode(retry, forKey: .retry)
    }
}
