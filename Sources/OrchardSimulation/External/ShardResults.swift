public import Foundation
import OrchardSupport
import OrchardClient
import OrchardHTTPClient
import OrchardOperator
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import Logging
import Synchronization

/// What a shard observed when a cycle of the process closed: one line of its `metrics.jsonl` (snake_case keys). The
/// device counters are this shard's, cumulative since it started; the test metrics are shard 1's evaluation of the
/// latest checkpoint (nil on other shards and on rounds not evaluated).
public struct ShardCycleMetrics: Sendable, Hashable, Codable {
    /// The cycle's number on the coordinator (cycles are numbered 1, 2, … whether aggregated or abandoned).
    public var cycle: Int
    /// The former name of ``cycle``.
    @available(*, deprecated, renamed: "cycle")
    public var round: Int {
        get { cycle }
        set { cycle = newValue }
    }
    /// Whether it produced a checkpoint (false: abandoned for too few reports).
    public var aggregated: Bool
    /// The latest checkpoint when it was observed.
    public var checkpoint: Int
    /// Aggregated cycles of the process so far.
    public var cyclesCompleted: Int
    /// Abandoned cycles of the process so far.
    public var cyclesAbandoned: Int
    /// Real seconds since this shard's devices started.
    public var wallSeconds: Double
    /// This shard's counters so far.
    public var checkIns, admitted, rejected, reported, dropped, late, failed: Int
    /// Test loss of the latest checkpoint (shard 1).
    public var testLoss: Double?
    /// Test accuracy, for classifiers (shard 1).
    public var testAccuracy: Double?
    /// Test RMSE, for regressors (shard 1).
    public var testRMSE: Double?
    /// ε spent under differential privacy, nil without it.
    public var epsilon: Double?
    /// The privacy clipping bound of the next cycle, nil without privacy.
    public var clippingNorm: Double?

    /// Creates a row.
    public init(
        cycle: Int, aggregated: Bool, checkpoint: Int, cyclesCompleted: Int, cyclesAbandoned: Int, wallSeconds: Double, checkIns: Int,
        admitted: Int, rejected: Int, reported: Int, dropped: Int, late: Int, failed: Int, testLoss: Double? = nil,
        testAccuracy: Double? = nil, testRMSE: Double? = nil, epsilon: Double? = nil, clippingNorm: Double? = nil
    ) {
        self.cycle = cycle
        self.aggregated = aggregated
        self.checkpoint = checkpoint
        self.cyclesCompleted = cyclesCompleted
        self.cyclesAbandoned = cyclesAbandoned
        self.wallSeconds = wallSeconds
        (self.checkIns, self.admitted, self.rejected, self.reported) = (checkIns, admitted, rejected, reported)
        (self.dropped, self.late, self.failed) = (dropped, late, failed)
        (self.testLoss, self.testAccuracy, self.testRMSE) = (testLoss, testAccuracy, testRMSE)
        (self.epsilon, self.clippingNorm) = (epsilon, clippingNorm)
    }

    // `cycle` is written under both `cycle` and its former key `round`, which scripts reading `metrics.jsonl` know;
    // either is read.
    private enum CodingKeys: String, CodingKey {
        case cycle, round, aggregated, checkpoint, admitted, rejected, reported, dropped, late, failed, epsilon
        case cyclesCompleted = "cycles_completed", cyclesAbandoned = "cycles_abandoned", wallSeconds = "wall_seconds", checkIns = "check_ins"
        case testLoss = "test_loss", testAccuracy = "test_accuracy", testRMSE = "test_rmse", clippingNorm = "clipping_norm"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        if let cycle = try c.decodeIfPresent(Int.self, forKey: .cycle) {
            self.cycle = cycle
        } else {
            self.cycle = try c.decode(Int.self, forKey: .round)
        }
        aggregated = try c.decode(Bool.self, forKey: .aggregated)
        checkpoint = try c.decode(Int.self, forKey: .checkpoint)
        cyclesCompleted = try c.decode(Int.self, forKey: .cyclesCompleted)
        cyclesAbandoned = try c.decode(Int.self, forKey: .cyclesAbandoned)
        wallSeconds = try c.decode(Double.self, forKey: .wallSeconds)
        checkIns = try c.decode(Int.self, forKey: .checkIns)
        admitted = try c.decode(Int.self, forKey: .admitted)
        rejected = try c.decode(Int.self, forKey: .rejected)
        reported = try c.decode(Int.self, forKey: .reported)
        dropped = try c.decode(Int.self, forKey: .dropped)
        late = try c.decode(Int.self, forKey: .late)
        failed = try c.decode(Int.self, forKey: .failed)
        testLoss = try c.decodeIfPresent(Double.self, forKey: .testLoss)
        testAccuracy = try c.decodeIfPresent(Double.self, forKey: .testAccuracy)
        testRMSE = try c.decodeIfPresent(Double.self, forKey: .testRMSE)
        epsilon = try c.decodeIfPresent(Double.self, forKey: .epsilon)
        clippingNorm = try c.decodeIfPresent(Double.self, forKey: .clippingNorm)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(cycle, forKey: .cycle)
        try c.encode(cycle, forKey: .round)
        try c.encode(aggregated, forKey: .aggregated)
        try c.encode(checkpoint, forKey: .checkpoint)
        try c.encode(cyclesCompleted, forKey: .cyclesCompleted)
        try c.encode(cyclesAbandoned, forKey: .cyclesAbandoned)
        try c.encode(wallSeconds, forKey: .wallSeconds)
        try c.encode(checkIns, forKey: .checkIns)
        try c.encode(admitted, forKey: .admitted)
        try c.encode(rejected, forKey: .rejected)
        try c.encode(reported, forKey: .reported)
        try c.encode(dropped, forKey: .dropped)
        try c.encode(late, forKey: .late)
        try c.encode(failed, forKey: .failed)
        try c.encodeIfPresent(testLoss, forKey: .testLoss)
        try c.encodeIfPresent(testAccuracy, forKey: .testAccuracy)
        try c.encodeIfPresent(testRMSE, forKey: .testRMSE)
        try c.encodeIfPresent(epsilon, forKey: .epsilon)
        try c.encodeIfPresent(clippingNorm, forKey: .clippingNorm)
    }
}

/// A shard's whole run, as written to its `summary.json` (snake_case keys).
public struct ShardSummary: Sendable, Hashable, Codable {
    /// The scenario's settings as strings, with the coordinator, shard, process and concurrency.
    public var settings: SimulationSettings
    /// `i/n`.
    public var shard: String
    /// Devices this shard ran.
    public var devices: Int
    /// The process the fleet trained.
    public var processID: String
    /// Whether this shard hosted it (false: it existed already, or another shard hosted it).
    public var hosted: Bool
    /// Closed cycles this shard observed (the rows of `metrics.jsonl`).
    public var rounds: Int
    /// Aggregated cycles of the process when the shard stopped.
    public var aggregatedRounds: Int
    /// Abandoned cycles of the process when the shard stopped.
    public var abandonedRounds: Int
    /// Real seconds from the devices' start to their stop.
    public var wallSeconds: Double
    /// Real seconds before (reaching the coordinator, data, pretraining, hosting or waiting for it).
    public var setupSeconds: Double
    /// Cycle requests this shard's devices sent.
    public var checkIns: Int
    /// Requests the coordinator admitted.
    public var admitted: Int
    /// Cycles that ended turned away (the coordinator's rejection, or a long `Retry-After`).
    public var rejected: Int
    /// Reports the coordinator accepted.
    public var reported: Int
    /// Admitted devices that went away (the fleet's dropout).
    public var dropped: Int
    /// Reports refused because their cycle had closed.
    public var late: Int
    /// Cycles that failed otherwise.
    public var failed: Int
    /// Rejections by the coordinator's reason (`cycle_full`, `rate_limited`, …).
    public var rejections: [String: Int]
    /// The last failure, if any.
    public var lastError: String?
    /// Shard 1: the evaluation of the checkpoint the shard started from.
    public var initial: Evaluation?
    /// Shard 1: the last evaluation.
    public var final: Evaluation?
    /// Shard 1: the best test accuracy, for classifiers.
    public var bestAccuracy: Double?
    /// Shard 1: the best test RMSE, for regressors.
    public var bestRMSE: Double?
    /// ε spent under differential privacy when the shard stopped, nil without it.
    public var epsilon: Double?
    /// The rounds asked for, when the shard was stopped (Ctrl-C) before the process aggregated them; nil otherwise.
    public var plannedRounds: Int? = nil

    private enum CodingKeys: String, CodingKey {
        case settings, shard, devices, hosted, rounds, admitted, rejected, reported, dropped, late, failed, rejections, initial, `final`, epsilon
        case plannedRounds = "planned_rounds"
        case processID = "process_id", aggregatedRounds = "aggregated_rounds", abandonedRounds = "abandoned_rounds"
        case wallSeconds = "wall_seconds", setupSeconds = "setup_seconds", checkIns = "check_ins", lastError = "last_error"
        case bestAccuracy = "best_accuracy", bestRMSE = "best_rmse"
    }
}

/// One device of a shard after the run.
public struct ShardDevice: Sendable, Hashable {
    /// Its global index in the fleet.
    public var device: Int
    /// The worker id the coordinator gave it, once it authenticated.
    public var workerID: String?
    /// Its reports the coordinator accepted.
    public var reported: Int
}

/// What a shard's run produced.
public struct ShardResult: Sendable {
    /// The directory holding `metrics.jsonl` and `summary.json`.
    public var directory: URL
    /// The summary.
    public var summary: ShardSummary
    /// One record per closed cycle observed.
    public var rounds: [ShardCycleMetrics]
    /// This shard's devices.
    public var devices: [ShardDevice]
}
