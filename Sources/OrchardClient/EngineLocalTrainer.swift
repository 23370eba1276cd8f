public import OrchardFormats
public import OrchardML
import OrchardProtocol
import Synchronization

/// Local training with the Orchard engine: builds the model from its architecture, loads the cycle's weights,
/// trains under the coordinator's client configuration (batch size, learning rate, epochs, update cap) with the
/// loss and optimizer of the architecture's training section, and returns the diff.
///
/// An interrupted run returns the engine's complete training state (weights, optimizer, position, dropout
/// stream), so the resumed run's diff is bit-identical to an uninterrupted one.
public struct EngineLocalTrainer: LocalTrainer {
    /// The loss used when the architecture has no training section.
    public var defaultLoss: LossType
    /// The optimizer used when the architecture has no training section (its learning rate is replaced by the
    /// client configuration's).
    public var defaultOptimizer: OptimizerSpec

    /// Creates a trainer.
    public init(defaultLoss: LossType = .meanSquaredError, defaultOptimizer: OptimizerSpec = .sgd()) {
        self.defaultLoss = defaultLoss
        self.defaultOptimizer = defaultOptimizer
    }

    public func parameterShapes(of spec: ModelSpec) throws(OrchardClientError) -> [String: [Int]] {
        // Building the model initialises its weights; a device asks for the same architecture every cycle.
        if let known = Self.shapes.withLock({ $0[spec] }) { return known }
        let shapes = try build(spec).parameterShapes
        Self.shapes.withLock { cache in
            if cache.count >= 16 { cache.removeAll() }
            cache[spec] = shapes
        }
        return shapes
    }

    /// Parameter shapes of recently seen architectures.
    private static let shapes = Mutex<[ModelSpec: [String: [Int]]]>([:])

    public func train(
        _ task: LocalTrainingTask, on dataset: any Dataset, resumingFrom checkpoint: [UInt8]?,
        progress: @escaping @Sendable (TrainingStep) -> Void
    ) throws(OrchardClientError) -> LocalTrainingOutcome {
        var original = try build(task.model.spec)
        do {
            try original.loadWeights(from: SafetensorsArchive(tensors: task.model.weights))
        } catch {
            throw OrchardClientError(.incompatibleModel, "the cycle's weights do not fit the model: \(error.message)")
        }
        let config = task.clientConfig
        var optimizer = task.model.spec.training?.optimizer ?? defaultOptimizer
        optimizer.learningRate = config.learningRate
        let configuration = TrainingConfiguration(
            loss: task.model.spec.training?.loss ?? defaultLoss, optimizer: optimizer, epochs: config.localEpochs,
            batchSize: config.batchSize, maxUpdates: config.maxUpdates, seed: task.seed
        )
        let outcome: TrainingOutcome
        do {
            let trainer = try Trainer(model: original, configuration: configuration)
            let resumed = try checkpoint.map { bytes throws(EngineError) in try TrainingState(checkpoint: bytes, model: original) }
            outcome = try trainer.train(on: dataset, resumingFrom: resumed) { step in
                progress(TrainingStep(epoch: step.epoch, batch: step.batch, batchesPerEpoch: step.batchesPerEpoch, updates: step.updates, loss: Double(step.loss)))
            }
        } catch where error.code == .cancelled {
            throw OrchardClientError(.cancelled, error.message)
        } catch {
            throw OrchardClientError(.training, "local training failed: \(error)")
        }
        switch outcome {
        case .interrupted(let state):
            return .interrupted(checkpoint: state.checkpoint())
        case .completed(let report):
            let diff: ParameterDiff
            do {
                diff = try Model.diff(original: original, trained: report.model)
            } catch {
                throw OrchardClientError(.training, "cannot compute the diff: \(error)")
            }
            var metrics: [String: Double] = ["updates": Double(report.updates)]
            if let last = report.epochs.last { metrics["loss"] = last.loss }
            return .completed(LocalUpdate(diff: diff.records, sampleCount: dataset.count, metrics: metrics))
        }
    }

    private func build(_ spec: ModelSpec) throws(OrchardClientError) -> Model {
        do {
            return try Model(spec: spec)
        } catch {
            throw OrchardClientError(.incompatibleModel, "the model '\(spec.name)' cannot be built on this device: \(error.message)")
        }
    }
}
