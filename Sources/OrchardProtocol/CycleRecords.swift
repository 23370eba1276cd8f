/// How a closed cycle ended.
public enum ClosedCycleOutcome: String, Sendable, Hashable, Codable {
    /// Enough reports: a checkpoint was published.
    case aggregated
    /// Too few reports (or a non-finite aggregate): the cycle reopened on the same checkpoint.
    case abandoned
}

/// One closed cycle, as the coordinator that closed it saw it.
public struct CycleRecord: Sendable, Hashable, Codable {
    /// The cycle's number.
    public var cycle: Int
    /// Aggregated or abandoned.
    public var outcome: ClosedCycleOutcome
    /// Devices admitted.
    public var assigned: Int
    /// Reports accepted.
    public var reported: Int
    /// The checkpoint it published, when aggregated.
    public var checkpoint: Int?
    /// When it opened, in seconds since 1970.
    public var openedAt: Double?
    /// When it closed, in seconds since 1970 (unknown for cycles closed before the history was kept).
    public var closedAt: Double?
    /// The mean of each metric the devices reported with their reports (e.g. `loss`), over the reports this
    /// coordinator accepted.
    public var metrics: [String: Double]
    /// The server-side evaluation of the checkpoint it published, when there is one.
    public var evaluation: CheckpointEvaluation?
    /// The federated evaluation of the checkpoint it published (devices' held-out splits), once finalized.
    public var federatedEvaluation: CheckpointEvaluation?

    enum CodingKeys: String, CodingKey {
        case cycle, outcome, assigned, reported, checkpoint, metrics, evaluation
        case openedAt = "opened_at"
        case closedAt = "closed_at"
        case federatedEvaluation = "federated_evaluation"
    }

    /// Creates a record.
    public init(
        cycle: Int, outcome: ClosedCycleOutcome, assigned: Int, reported: Int, checkpoint: Int? = nil, openedAt: Double? = nil, closedAt: Double?,
        metrics: [String: Double] = [:]
    ) {
        self.cycle = cycle
        self.outcome = outcome
        self.assigned = assigned
        self.reported = reported
        self.checkpoint = checkpoint
        self.openedAt = openedAt
        self.closedAt = closedAt
        self.metrics = metrics
    }
}

/// Admin: a process's recently closed cycles, oldest first.
public struct ProcessCycles: Sendable, Hashable, Codable {
    /// The process.
    public var processID: String
    /// The cycles, oldest first (the newest 200), as the store recorded them when each closed.
    public var cycles: [CycleRecord]

    enum CodingKeys: String, CodingKey {
        case processID = "process_id"
        case cycles
    }

    /// Creates a list.
    public init(processID: String, cycles: [CycleRecord]) {
        self.processID = processID
        self.cycles = cycles
    }
}
