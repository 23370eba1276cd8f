/// One checkpoint of a process evaluated on held-out data: the global model's quality, as a number people can read.
public struct CheckpointEvaluation: Sendable, Hashable, Codable {
    /// The checkpoint evaluated.
    public var checkpoint: Int
    /// Samples evaluated.
    public var samples: Int
    /// The metrics by snake_case name: `loss` always; `accuracy` for a classifier; `rmse` and `mae` for a regressor.
    /// An extensible set: a sequence model adds its own (e.g. `perplexity`).
    public var metrics: [String: Double]
    /// When it was evaluated, in seconds since 1970.
    public var evaluatedAt: Double

    enum CodingKeys: String, CodingKey {
        case checkpoint, samples, metrics
        case evaluatedAt = "evaluated_at"
    }

    /// Creates an evaluation.
    public init(checkpoint: Int, samples: Int, metrics: [String: Double], evaluatedAt: Double) {
        self.checkpoint = checkpoint
        self.samples = samples
        self.metrics = metrics
        self.evaluatedAt = evaluatedAt
    }
}

/// Admin: a process's server-side evaluations, oldest first.
public struct ProcessEvaluations: Sendable, Hashable, Codable {
    /// The process.
    public var processID: String
    /// Bytes of the held-out data the coordinator evaluates each published checkpoint on; nil when none is attached.
    public var dataBytes: Int?
    /// Samples in that data; nil when none is attached.
    public var dataSamples: Int?
    /// The evaluations, oldest first (the newest 200).
    public var evaluations: [CheckpointEvaluation]

    enum CodingKeys: String, CodingKey {
        case processID = "process_id"
        case dataBytes = "data_bytes"
        case dataSamples = "data_samples"
        case evaluations
    }

    /// Creates a list.
    public init(processID: String, dataBytes: Int?, dataSamples: Int?, evaluations: [CheckpointEvaluation]) {
        self.processID = processID
        self.dataBytes = dataBytes
        self.dataSamples = dataSamples
        self.evaluations = evaluations
    }
}
