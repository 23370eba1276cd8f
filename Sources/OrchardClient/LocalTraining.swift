public import OrchardFormats
public import OrchardML
import OrchardProtocol

/// The weights a device trains from, with their architecture.
public struct CycleModel: Sendable {
    /// The architecture.
    public var spec: ModelSpec
    /// The weights as downloaded (the checkpoint of the cycle).
    public var weights: [TensorRecord]

    /// Creates a model.
    public init(spec: ModelSpec, weights: [TensorRecord]) {
        self.spec = spec
        self.weights = weights
    }
}

/// What local training produced for a report: the diff (`trained − received`), the number of samples it was
/// trained on (its weight in the average) and informational metrics such as `loss`.
public struct LocalUpdate: Sendable {
    /// One tensor per weight, same names and shapes, `trained − received`.
    public var diff: [TensorRecord]
    /// The samples the update was trained on.
    public var sampleCount: Int
    /// Metrics sent with the report.
    public var metrics: [String: Double]

    /// Creates an update.
    public init(diff: [TensorRecord], sampleCount: Int, metrics: [String: Double] = [:]) {
        self.diff = diff
        self.sampleCount = sampleCount
        self.metrics = metrics
    }
}

/// One batch of local training, as reported to progress observers.
public struct TrainingStep: Sendable, Hashable {
    /// The epoch, from 0.
    public var epoch: Int
    /// The batch just finished within the epoch, from 0.
    public var batch: Int
    /// Batches per epoch.
    public var batchesPerEpoch: Int
    /// Updates applied so far in this cycle.
    public var updates: Int
    /// Mean loss of the batch.
    public var loss: Double

    /// Creates a step.
    public init(epoch: Int, batch: Int, batchesPerEpoch: Int, updates: Int, loss: Double) {
        self.epoch = epoch
        self.batch = batch
        self.batchesPerEpoch = batchesPerEpoch
        self.updates = updates
        self.loss = loss
    }
}

/// A cycle's local training: the model and the settings resolved from its plan
/// (``OrchardML/TrainingConfiguration/resolved(architecture:clientConfig:seed:)``).
public struct LocalTrainingTask: Sendable {
    /// The model to train from.
    public var model: CycleModel
    /// Loss, optimizer, epochs, batch size, update cap and the cycle's seed (fixed per cycle, so a resumed run
    /// equals an uninterrupted one).
    public var training: TrainingConfiguration
    /// Stop once this many updates in all are done and return the state as
    /// ``LocalTrainingOutcome/interrupted(checkpoint:)`` (a run budgeted to a background window); nil trains to the end.
    public var pauseAfterUpdates: Int?

    /// Creates a task.
    public init(model: CycleModel, training: TrainingConfiguration, pauseAfterUpdates: Int? = nil) {
        self.model = model
        self.training = training
        self.pauseAfterUpdates = pauseAfterUpdates
    }
}

/// How local training ended.
public enum LocalTrainingOutcome: Sendable {
    /// Training finished; the update is ready to report.
    case completed(LocalUpdate)
    /// The task was cancelled at a batch boundary; the bytes continue the run exactly.
    case interrupted(checkpoint: [UInt8])
}

/// The trainer a job uses for ``FederatedJob/train(on:constraints:tasks:)``: the Orchard engine by default
/// (``EngineLocalTrainer``); replaceable for tests and for devices with their own runtime.
public protocol LocalTrainer: Sendable {
    /// The parameter names and shapes of a model, to check downloaded weights against.
    func parameterShapes(of spec: ModelSpec) throws(OrchardClientError) -> [String: [Int]]
    /// Trains until done or until the current task is cancelled, resuming from `checkpoint` when given. Asynchronous,
    /// so a trainer that waits for another runtime (Core ML's `MLUpdateTask`) suspends instead of blocking a thread
    /// of the cooperative pool; a synchronous implementation satisfies it too (the engine's does).
    /// - Parameters:
    ///   - task: What to train.
    ///   - dataset: The device's local samples.
    ///   - checkpoint: Bytes from an earlier ``LocalTrainingOutcome/interrupted(checkpoint:)`` of the same task.
    ///   - progress: Called after every batch.
    func train(
        _ task: LocalTrainingTask, on dataset: any Dataset, resumingFrom checkpoint: [UInt8]?,
        progress: @escaping @Sendable (TrainingStep) -> Void
    ) async throws(OrchardClientError) -> LocalTrainingOutcome
    /// The updates a checkpoint of `task` (from ``LocalTrainingOutcome/interrupted(checkpoint:)``) has done.
    func completedUpdates(in checkpoint: [UInt8], of task: LocalTrainingTask) throws(OrchardClientError) -> Int
    /// The model's metrics on `dataset` without training it (an evaluation task on the held-out split): the loss of the
    /// architecture's training section, and accuracy (classifiers) or RMSE and MAE (regressors). The default runs the
    /// Orchard engine's forward pass, which serves any trainer whose models the engine can build.
    func evaluate(_ model: CycleModel, on dataset: any Dataset) async throws(OrchardClientError) -> EvaluationMetrics
}

extension LocalTrainer {
    public func evaluate(_ model: CycleModel, on dataset: any Dataset) async throws(OrchardClientError) -> EvaluationMetrics {
        try EngineLocalTrainer.evaluate(model, on: dataset)
    }
}
