public import Foundation
import OrchardData
import OrchardSupport
public import OrchardFormats
public import OrchardML
public import OrchardClient

/// Real local training through the device SDK's own trainer (`EngineLocalTrainer`): each device
/// trains its own data slice from the downloaded global model under the settings the coordinator sent, pausing
/// with a training-state checkpoint when its background window ends and resuming from it in the next; the global
/// model is evaluated on a held-out test set.
///
/// The datasets are immutable values that the devices only read, so the workload is shared between the
/// concurrent trainings (`@unchecked` because the engine's dataset types do not declare `Sendable`).
public struct EngineWorkload<Slice: Dataset, TestSet: Dataset>: FleetWorkload, @unchecked Sendable {
    /// The architecture every device trains.
    public let model: Model
    /// Each device's data.
    public let slices: [Slice]
    /// The held-out test set.
    public let testSet: TestSet
    /// The loss the test set is evaluated with (the architecture's).
    public let evaluationLoss: LossType
    /// Metadata the hosted model's initial weights carry (a text model's vocabulary).
    public var weightsMetadata: [String: String] = [:]
    /// Poisoning devices, if any: the attack, the devices that run it, and the classes a label-flip maps over.
    public var attack: (configuration: AttackConfiguration, attackers: Set<Int>, classes: Int)?
    /// The SDK trainer the devices train with.
    private let trainer = EngineLocalTrainer()
    private let testTargets: [Float]
    /// The test set cut into one contiguous part per core, evaluated concurrently.
    private let testParts: [DatasetSlice<TestSet>]

    /// Creates a workload.
    /// - Parameters:
    ///   - model: The architecture (its weights are replaced by each download).
    ///   - slices: One dataset per device.
    ///   - testSet: The evaluation data.
    ///   - evaluationParallelism: Parts of the test set evaluated at the same time (defaults to the number of cores).
    public init(
        model: Model, slices: [Slice], testSet: TestSet,
        evaluationParallelism: Int = ProcessInfo.processInfo.activeProcessorCount
    ) {
        self.model = model
        self.slices = slices
        self.testSet = testSet
        evaluationLoss = model.spec.training?.loss ?? TrainingConfiguration().loss
        testTargets = Self.targets(of: testSet)
        let parts = max(1, min(evaluationParallelism, testSet.count))
        testParts = (0..<parts).map { p in
            DatasetSlice(testSet, indices: Array((p * testSet.count / parts)..<((p + 1) * testSet.count / parts)))
        }
    }

    /// The size of `device`'s data slice.
    public func sampleCount(device: Int) -> Int { slices[device].count }

    /// Trains `device`'s slice with the SDK's trainer (the engine's complete training state is the checkpoint
    /// between stretches, so a resumed run equals an uninterrupted one bit for bit).
    /// An attacking device trains the same way (on flipped labels for label-flip) and poisons the finished update.
    public func train(device: Int, _ task: LocalTrainingTask, on indices: [Int]?, resumingFrom checkpoint: [UInt8]?) throws(OrchardClientError)
        -> LocalTrainingOutcome
    {
        guard let attack, attack.attackers.contains(device) else {
            guard let indices else { return try trainer.train(task, on: slices[device], resumingFrom: checkpoint, progress: { _ in }) }
            return try trainer.train(task, on: DatasetSlice(slices[device], indices: indices), resumingFrom: checkpoint, progress: { _ in })
        }
        let own: any Dataset = indices.map { DatasetSlice(slices[device], indices: $0) } ?? slices[device]
        let data: any Dataset = attack.configuration.kind == .labelFlip ? LabelFlippedDataset(base: own, classes: attack.classes) : own
        switch try trainer.train(task, on: data, resumingFrom: checkpoint, progress: { _ in }) {
        case .completed(let update): return .completed(attack.configuration.poison(update, task: task, device: device))
        case .interrupted(let state): return .interrupted(checkpoint: state)
        }
    }

    /// The SDK's evaluation of `model` on the samples `indices` of `device`'s slice.
    public func evaluate(device: Int, model: CycleModel, on indices: [Int]) throws(OrchardClientError) -> EvaluationMetrics {
        try trainer.evaluate(model, on: DatasetSlice(slices[device], indices: indices))
    }

    /// The update count recorded in a training-state checkpoint.
    public func completedUpdates(device: Int, in checkpoint: [UInt8], of task: LocalTrainingTask) throws(OrchardClientError) -> Int {
        try trainer.completedUpdates(in: checkpoint, of: task)
    }

    /// Test loss and accuracy (classifiers: cross-entropy of the softmax output) or RMSE (regressors: MSE loss).
    /// The parts of the test set are evaluated concurrently and their sums combined in a fixed order, so the result
    /// does not depend on thread scheduling.
    public func evaluate(model weights: [UInt8]) async throws(SimulationError) -> Evaluation {
        do {
            var evaluated = model
            try evaluated.loadWeights(safetensors: weights)
            let global = evaluated
            let width = testSet.targetSpec.elementCount
            let sums = try await withThrowingTaskGroup(of: (Int, LossSums).self) { group in
                for index in testParts.indices {
                    group.addTask {
                        let part = self.testParts[index]
                        let start = (part.indices.first ?? 0) * width
                        let targets = self.testTargets[start..<(start + part.count * width)]
                        let loss = self.evaluationLoss
                        return (index, try await offCooperativePool { try Self.sums(global, on: part, targets: targets, loss: loss) })
                    }
                }
                var results = [LossSums](repeating: LossSums(), count: testParts.count)
                for try await (index, sums) in group { results[index] = sums }
                return results.reduce(LossSums()) { $0.adding($1) }
            }
            return sums.evaluation(samples: testSet.count, targetValues: testTargets.count, loss: evaluationLoss)
        } catch {
            throw SimulationError(.training, "cannot evaluate the global model: \(error)")
        }
    }

    /// Every target of a dataset, in order (read once; the test set is evaluated after every round).
    static func targets(of data: TestSet) -> [Float] {
        let width = data.targetSpec.elementCount
        var values = [Float](repeating: 0, count: data.count * width)
        values.withUnsafeMutableBufferPointer { buffer in
            for j in 0..<data.count { data.copyTarget(of: j, into: UnsafeMutableBufferPointer(rebasing: buffer[(j * width)..<((j + 1) * width)])) }
        }
        return values
    }

    /// Loss and hit sums of a model over part of the test set (``OrchardML/Model/lossSums(on:targets:loss:batchSize:outputBudget:)``);
    /// `targets` are that part's targets.
    static func sums(_ model: Model, on data: DatasetSlice<TestSet>, targets: ArraySlice<Float>, loss: LossType) throws(EngineError) -> LossSums {
        try model.lossSums(on: data, targets: targets, loss: loss)
    }
}

extension LossSums {
    /// Mean loss and accuracy (classifiers) or MSE and RMSE (regressors).
    func evaluation(samples: Int, targetValues: Int, loss type: LossType) -> Evaluation {
        let mean = mean(samples: samples, targetValues: targetValues, loss: type)
        if let accuracy = mean.accuracy { return Evaluation(loss: mean.loss, accuracy: accuracy, perplexity: positions > samples ? perplexity : nil) }
        return Evaluation(loss: mean.loss, rmse: mean.loss.squareRoot())
    }
}
