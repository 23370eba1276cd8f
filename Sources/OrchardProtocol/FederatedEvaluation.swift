import OrchardPrivacy

/// Federated evaluation (`server_config.evaluation`): devices run a published checkpoint on their held-out split
/// (`client_config.holdout_fraction`) and report metrics only, no update; the coordinator aggregates them, sample-weighted,
/// per checkpoint.
///
/// When it runs is a property of checkpoints, not of cycles: every checkpoint whose number is a multiple of ``every``
/// (checkpoint 0, the initial model, included) is evaluated while it is the latest one — during the cycle that trains
/// from it, and after a completed process's last publication. A device that checks in with the evaluation task in its
/// ``CycleRequest/tasks`` is given an evaluation (with probability ``fraction``) while the checkpoint has fewer than
/// ``goal`` results; it can then ask again for training in the same window. The evaluation is finalized — aggregated,
/// noised when ``noise`` is set, and recorded — when ``goal`` results are in or when a newer checkpoint is published.
public struct FederatedEvaluationConfig: Sendable, Hashable, Codable {
    /// Evaluate checkpoints whose number is a multiple of this (1: every checkpoint).
    public var every: Int
    /// Device results aggregated per checkpoint.
    public var goal: Int
    /// The probability that an eligible device checking in is given the evaluation rather than training, in (0, 1].
    public var fraction: Double
    /// Seconds a device has to send its result after being given the task.
    public var reportWithin: Double
    /// The largest sample count one device's result weighs in the mean, if set (unset: as many as it evaluated, up to
    /// `server_config.maximum_sample_count`), so that one device claiming many samples cannot set the result alone.
    /// Under ``noise`` the noise's own ``EvaluationNoise/maximumSamples`` is the cap, and this must be unset or equal.
    public var maximumSamples: Int?
    /// Noised sums, for processes under differential privacy, if set.
    public var noise: EvaluationNoise?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case every, goal, fraction, noise
        case reportWithin = "report_within"
        case maximumSamples = "maximum_samples"
    }

    /// Creates a configuration.
    public init(
        every: Int = 1, goal: Int, fraction: Double = 1, reportWithin: Double = 300, maximumSamples: Int? = nil, noise: EvaluationNoise? = nil
    ) {
        self.every = every
        self.goal = goal
        self.fraction = fraction
        self.reportWithin = reportWithin
        self.maximumSamples = maximumSamples
        self.noise = noise
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.evaluation")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = FederatedEvaluationConfig(goal: 1)
        every = try c.decodeIfPresent(Int.self, forKey: .every) ?? d.every
        goal = try c.decode(Int.self, forKey: .goal)
        fraction = try c.decodeIfPresent(Double.self, forKey: .fraction) ?? d.fraction
        reportWithin = try c.decodeIfPresent(Double.self, forKey: .reportWithin) ?? d.reportWithin
        maximumSamples = try c.decodeIfPresent(Int.self, forKey: .maximumSamples)
        noise = try c.decodeIfPresent(EvaluationNoise.self, forKey: .noise)
    }

    /// Whether checkpoint `number` is one to evaluate.
    public func evaluates(checkpoint number: Int) -> Bool { number >= 0 && number % every == 0 }

    /// The most evaluation tasks open at once for one checkpoint: the goal plus a margin for devices that never answer.
    public var capacity: Int { goal + max(1, goal / 4) }

    /// Describes the first invalid field, or nil.
    public func validationFailure() -> String? {
        let prefix = "server_config.evaluation"
        if !(1...1_000_000).contains(every) { return "\(prefix).every must be in 1...1000000, not \(every)" }
        if !(1...WireLimits.maximumGoalCount).contains(goal) { return "\(prefix).goal must be in 1...\(WireLimits.maximumGoalCount), not \(goal)" }
        if !(fraction > 0 && fraction <= 1) { return "\(prefix).fraction must be in (0, 1], not \(fraction)" }
        if !(reportWithin > 0 && reportWithin <= WireLimits.maximumSeconds) {
            return "\(prefix).report_within must be a positive number of seconds, at most \(WireLimits.maximumSeconds), not \(reportWithin)"
        }
        if let maximumSamples {
            if maximumSamples < 1 { return "\(prefix).maximum_samples must be at least 1, not \(maximumSamples)" }
            if let noise, noise.maximumSamples != maximumSamples {
                return
                    "\(prefix).maximum_samples (\(maximumSamples)) differs from \(prefix).noise.maximum_samples (\(noise.maximumSamples)): under noise the noise's cap weighs each result; set one, or both alike"
            }
        }
        if let noise, let failure = noise.validationFailure() { return failure }
        return nil
    }
}

/// Noised sums for federated evaluation under differential privacy (`server_config.evaluation.noise`).
///
/// Each device's weight is its sample count capped at ``maximumSamples``, and each metric is clamped to
/// [0, bound] (1 for accuracy, ``lossBound`` for loss and MAE), so one device moves the weight sum by at most W and
/// a metric's weighted sum by at most W·bound. The coordinator adds N(0, (z·W)²) to the weight sum and N(0, (z·W·bound)²)
/// to each metric's sum, releases only the ratios, and never releases a device's own values or the exact number of
/// devices. The released metrics are `loss` with `accuracy` (classifiers) or `mae` (regressors), both weighted by the
/// capped sample count (for a sequence model too); `rmse` is derived from the noised loss, and `perplexity` is not
/// released.
public struct EvaluationNoise: Sendable, Hashable, Codable {
    /// z: each sum's noise standard deviation as a multiple of its sensitivity.
    public var noiseMultiplier: Double
    /// W: the largest sample count one device's result weighs.
    public var maximumSamples: Int
    /// The value the loss (and MAE) of one device is clamped to.
    public var lossBound: Double

    enum CodingKeys: String, CodingKey, CaseIterable {
        case noiseMultiplier = "noise_multiplier"
        case maximumSamples = "maximum_samples"
        case lossBound = "loss_bound"
    }

    /// Creates noise settings.
    public init(noiseMultiplier: Double, maximumSamples: Int, lossBound: Double) {
        self.noiseMultiplier = noiseMultiplier
        self.maximumSamples = maximumSamples
        self.lossBound = lossBound
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.evaluation.noise")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        noiseMultiplier = try c.decode(Double.self, forKey: .noiseMultiplier)
        maximumSamples = try c.decode(Int.self, forKey: .maximumSamples)
        lossBound = try c.decode(Double.self, forKey: .lossBound)
    }

    /// The sums released per evaluation: the weight and the two metrics.
    public static let releasedSums = 3

    /// The noise multiplier of the release as one Gaussian mechanism on the vector of its sums, each scaled by its
    /// sensitivity: z/√3, which the accountant charges per finalized evaluation.
    public var accountedNoiseMultiplier: Double { noiseMultiplier / Double(Self.releasedSums).squareRoot() }

    /// Describes the first invalid field, or nil.
    public func validationFailure() -> String? {
        let prefix = "server_config.evaluation.noise"
        if !(noiseMultiplier > 0 && noiseMultiplier.isFinite) { return "\(prefix).noise_multiplier must be a positive finite number, not \(noiseMultiplier)" }
        if maximumSamples < 1 { return "\(prefix).maximum_samples must be at least 1, not \(maximumSamples)" }
        if !(lossBound > 0 && lossBound.isFinite) { return "\(prefix).loss_bound must be a positive finite number, not \(lossBound)" }
        return nil
    }
}

/// A kind of task a device can take when it checks in (``CycleRequest/tasks``).
public enum DeviceTask: String, Sendable, Hashable, Codable, CaseIterable, CustomStringConvertible {
    /// Train on the local training split and report an update.
    case training
    /// Evaluate the latest checkpoint on the local held-out split and report metrics only.
    case evaluation

    public var description: String { rawValue }
}

/// A device was given an evaluation task: run checkpoint ``checkpoint`` on its held-out split and send an
/// ``EvaluationReport`` within ``reportWithin`` seconds.
public struct EvaluationAssignment: Sendable, Hashable, Codable {
    /// The key that authorizes this worker's plan and model downloads and its one result for the checkpoint.
    public var requestKey: String
    /// The process's id.
    public var processID: String
    /// The checkpoint to evaluate.
    public var checkpoint: Int
    /// The id to download the model with (``Endpoint/model(_:)``).
    public var modelID: String
    /// The id to download the plan with (``Endpoint/plan(_:)``).
    public var planID: String
    /// Seconds from now until the result is due.
    public var reportWithin: Double

    enum CodingKeys: String, CodingKey {
        case requestKey = "request_key"
        case processID = "process_id"
        case checkpoint
        case modelID = "model_id"
        case planID = "plan_id"
        case reportWithin = "report_within"
    }

    /// Creates an assignment.
    public init(requestKey: String, processID: String, checkpoint: Int, modelID: String, planID: String, reportWithin: Double) {
        self.requestKey = requestKey
        self.processID = processID
        self.checkpoint = checkpoint
        self.modelID = modelID
        self.planID = planID
        self.reportWithin = reportWithin
    }
}

/// A device's evaluation result: the checkpoint's metrics on its held-out split (means over ``samples`` samples).
public struct EvaluationReport: Sendable, Hashable, Codable {
    /// The worker id.
    public var workerID: String
    /// The key of the ``EvaluationAssignment``.
    public var requestKey: String
    /// Held-out samples evaluated (at least 1).
    public var samples: Int
    /// Mean metrics by snake_case name: `loss`, and `accuracy` or `mae`, as the engine computes them.
    public var metrics: [String: Double]
    /// For a model with a sequence output, the positions scored (those that are not padding), which `accuracy` and
    /// `perplexity` are means over (protocol 2.7; required for such a model, refused for any other).
    public var positions: Int?

    enum CodingKeys: String, CodingKey {
        case workerID = "worker_id"
        case requestKey = "request_key"
        case samples, metrics, positions
    }

    /// Creates a report.
    public init(workerID: String, requestKey: String, samples: Int, metrics: [String: Double], positions: Int? = nil) {
        self.workerID = workerID
        self.requestKey = requestKey
        self.samples = samples
        self.metrics = metrics
        self.positions = positions
    }

    /// The most metrics one report may carry.
    public static let maximumMetrics = WireLimits.maximumMetrics
    /// The largest magnitude a metric may have: one device's values stay far from overflowing a sum over the goal.
    public static let maximumMagnitude = WireLimits.maximumMetricMagnitude
    /// Metrics that cannot be negative.
    static let nonNegative: Set<String> = ["loss", "mae", "rmse", "perplexity"]

    /// Describes the first unusable field, or nil.
    public func validationFailure() -> String? {
        if samples < 1 { return "samples must be at least 1, not \(samples)" }
        if let positions, positions < 0 { return "positions must not be negative, not \(positions)" }
        if let failure = WireLimits.metricsFailure(metrics) { return failure }
        if metrics["loss"] == nil { return "metrics must include loss" }
        for (name, value) in metrics.sorted(by: { $0.key < $1.key }) {
            if name == "accuracy" && !(0...1).contains(value) { return "metric 'accuracy' must be in [0, 1], not \(value)" }
            if Self.nonNegative.contains(name) && value < 0 { return "metric '\(name)' must not be negative, not \(value)" }
        }
        return nil
    }
}

/// The coordinator's acknowledgement of an ``EvaluationReport``, sent after the result is stored.
public struct EvaluationReportResponse: Sendable, Hashable, Codable {
    /// The checkpoint the result counted toward.
    public var checkpoint: Int
    /// Results stored for that checkpoint so far, this one included.
    public var resultsReceived: Int

    enum CodingKeys: String, CodingKey {
        case checkpoint
        case resultsReceived = "results_received"
    }

    /// Creates a response.
    public init(checkpoint: Int, resultsReceived: Int) {
        self.checkpoint = checkpoint
        self.resultsReceived = resultsReceived
    }
}
