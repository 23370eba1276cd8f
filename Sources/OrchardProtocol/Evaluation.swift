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
    /// A federated evaluation's number of device results (nil server-side, and when the sums were noised: the exact
    /// count of devices is not released then).
    public var devices: Int?
    /// A noised federated evaluation's ε: what the noised evaluations released so far, this one included, spent at the
    /// process's δ (the training releases' ε is separate; together they spend at most the sum).
    public var epsilon: Double?

    enum CodingKeys: String, CodingKey {
        case checkpoint, samples, metrics, devices, epsilon
        case evaluatedAt = "evaluated_at"
    }

    /// Creates an evaluation.
    public init(checkpoint: Int, samples: Int, metrics: [String: Double], evaluatedAt: Double, devices: Int? = nil, epsilon: Double? = nil) {
        self.devices = devices
        self.epsilon = epsilon
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
    /// The server-side evaluations, oldest first (the newest 200).
    public var evaluations: [CheckpointEvaluation]
    /// The federated evaluations (devices' held-out splits), oldest first (the newest 200).
    public var federated: [CheckpointEvaluation]

    enum CodingKeys: String, CodingKey {
        case processID = "process_id"
        case dataBytes = "data_bytes"
        case dataSamples = "data_samples"
        case evaluations, federated
    }

    /// Creates a list.
    public init(processID: String, dataBytes: Int?, dataSamples: Int?, evaluations: [CheckpointEvaluation], federated: [CheckpointEvaluation] = []) {
        self.federated = federated
        self.processID = processID
        self.dataBytes = dataBytes
        self.dataSamples = dataSamples
        self.evaluations = evaluations
    }
}

extension ProcessEvaluations {
    /// Decodes a list; a missing `federated` (a coordinator before protocol 2.5) reads as none.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        processID = try c.decode(String.self, forKey: .processID)
        dataBytes = try c.decodeIfPresent(Int.self, forKey: .dataBytes)
        dataSamples = try c.decodeIfPresent(Int.self, forKey: .dataSamples)
        evaluations = try c.decode([CheckpointEvaluation].self, forKey: .evaluations)
        federated = try c.decodeIfPresent([CheckpointEvaluation].self, forKey: .federated) ?? []
    }
}
