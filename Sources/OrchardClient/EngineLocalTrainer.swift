public import OrchardFormats
public import OrchardML
import OrchardProtocol
import Synchronization

/// Local training with the Orchard engine: builds the model from its architecture, loads the cycle's weights,
/// trains with the task's resolved settings (``OrchardML/TrainingConfiguration/resolved(architecture:clientConfig:seed:)``)
/// and returns the diff.
///
/// An interrupted run returns the engine's complete training state (weights, optimizer, position, dropout
/// stream), so the resumed run's diff is bit-identical to an uninterrupted one.
public struct EngineLocalTrainer: LocalTrainer {
    /// Creates a trainer.
    public init() {}

    public func parameterShapes(of spec: ModelSpec) throws(OrchardClientError) -> [String: [Int]] {
        try model(spec).parameterShapes
    }

    /// Models of recently seen architectures, as built (a copy is a value: loading weights into it leaves these alone).
    private static let built = Mutex<[ModelSpec: Model]>([:])

    /// `spec` built: building initialises every weight, and a device asks for the same architecture every cycle, whose
    /// weights it then loads over the initial ones.
    private func model(_ spec: ModelSpec) throws(OrchardClientError) -> Model {
        if let known = Self.built.withLock({ $0[spec] }) { return known }
        let model = try build(spec)
        Self.built.withLock { cache in
            if cache.count >= 16 { cache.removeAll() }
            cache[spec] = model
        }
        return model
    }

    public func train(
        _ task: LocalTrainingTask, on dataset: any Dataset, resumingFrom checkpoint: [UInt8]?,
        progress: @escaping @Sendable (TrainingStep) -> Void
    ) throws(OrchardClientError) -> LocalTrainingOutcome {
        var original = try model(task.model.spec)
        do {
            try original.loadWeights(from: SafetensorsArchive(tensors: task.model.weights))
        } catch {
            throw OrchardClientError(.incompatibleModel, "the cycle's weights do not fit the model: \(error.message)")
        }
        var configuration = task.training
        let full = configuration.plannedUpdates(samples: dataset.count)
        // A pause point short of the end: the engine stops there, and the state is returned to resume from.
        let pauses = task.pauseAfterUpdates.map { $0 < full } ?? false
        if pauses, let pause = task.pauseAfterUpdates { configuration.maxUpdates = max(0, pause) }
        let outcome: TrainingOutcome
        do {
            let trainer = try Trainer(model: original, configuration: configuration)
            let resumed = try checkpoint.map { bytes throws(EngineError) in try TrainingState(checkpoint: bytes, model: original) }
            outcome = try trainer.train(on: dataset, resumingFrom: resumed) { step in
                progress(
                    TrainingStep(epoch: step.epoch, batch: step.batch, batchesPerEpoch: step.batchesPerEpoch, updates: step.updates, loss: Double(step.loss)))
            }
        } catch  where error.code == .cancelled {
            throw OrchardClientError(.cancelled, error.message)
        } catch {
            throw OrchardClientError(.training, "local training failed: \(error)")
        }
        if pauses { return .interrupted(checkpoint: outcome.state.checkpoint()) }
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

    public func completedUpdates(in checkpoint: [UInt8], of task: LocalTrainingTask) throws(OrchardClientError) -> Int {
        do {
            return try TrainingState(checkpoint: checkpoint, model: model(task.model.spec)).position.updates
        } catch {
            throw OrchardClientError(.training, "the saved training state is unreadable: \(error)")
        }
    }

    public func evaluate(_ model: CycleModel, on dataset: any Dataset) throws(OrchardClientError) -> EvaluationMetrics {
        try Self.evaluate(model, on: dataset)
    }

    /// The engine's metrics of `model` on `dataset` (``OrchardML/Model/evaluationMetrics(on:loss:batchSize:)``).
    static func evaluate(_ model: CycleModel, on dataset: any Dataset) throws(OrchardClientError) -> EvaluationMetrics {
        guard let loss = model.spec.training?.loss else {
            throw OrchardClientError(.incompatibleModel, "model '\(model.spec.name)' has no training section to take the evaluation loss from")
        }
        var built = try EngineLocalTrainer().model(model.spec)
        do {
            try built.loadWeights(from: SafetensorsArchive(tensors: model.weights))
        } catch {
            throw OrchardClientError(.incompatibleModel, "the checkpoint's weights do not fit the model: \(error.message)")
        }
        do {
            return try built.evaluationMetrics(on: dataset, loss: loss)
        } catch {
            throw OrchardClientError(.training, "evaluation failed: \(error.message)")
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
