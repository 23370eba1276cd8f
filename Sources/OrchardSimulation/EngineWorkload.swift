import Foundation
public import OrchardFormats
public import OrchardML
import OrchardProtocol

/// Real local training with the Orchard engine: each device trains its own data slice from the downloaded
/// global model, writing a training-state checkpoint whenever its background window expires and resuming from
/// that checkpoint in the next window; the global model is evaluated on a held-out test set.
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
    /// Loss, optimizer, local epochs and batch size.
    public let training: TrainingConfiguration
    /// The simulation seed (each device and round derives its shuffle order from it).
    public let seed: UInt64

    /// Creates a workload.
    /// - Parameters:
    ///   - model: The architecture (its weights are replaced by each download).
    ///   - slices: One dataset per device.
    ///   - testSet: The evaluation data.
    ///   - training: Local training settings (`seed` and `maxUpdates` are set per device and window).
    ///   - seed: The simulation seed.
    public init(model: Model, slices: [Slice], testSet: TestSet, training: TrainingConfiguration, seed: UInt64) {
        self.model = model
        self.slices = slices
        self.testSet = testSet
        self.training = training
        self.seed = seed
    }

    /// `epochs × ⌈samples / batch⌉`, or the configuration's update cap when smaller.
    public func updatesPerRound(device: Int) -> Int {
        let batches = (slices[device].count + training.batchSize - 1) / training.batchSize
        let full = training.epochs * batches
        return training.maxUpdates.map { min($0, full) } ?? full
    }

    /// Trains one device across its background windows.
    public func train(_ assignment: FleetAssignment, updatesPerWindow: [Int], round: Int) async throws(SimulationError) -> DeviceUpdate {
        let data = slices[assignment.device]
        do {
            var start = model
            try start.loadWeights(safetensors: assignment.model)
            var configuration = training
            var deviceRandom = OrchardRandom.derived(seed: seed, stream: UInt64(assignment.device) << 32 | UInt64(round))
            configuration.seed = deviceRandom.next()
            var checkpoint: [UInt8]?
            var restored = 0
            var completed = 0
            var outcome: TrainingOutcome?
            for (index, stretch) in updatesPerWindow.enumerated() {
                completed += stretch
                let last = index == updatesPerWindow.count - 1
                configuration.maxUpdates = last ? training.maxUpdates : completed
                let trainer = try Trainer(model: start, configuration: configuration)
                var resume: TrainingState?
                if let checkpoint {
                    resume = try TrainingState(checkpoint: checkpoint, model: start)
                    restored += 1
                }
                let result = try trainer.train(on: data, resumingFrom: resume)
                // The background window expires here: persist everything the next window needs.
                if !last { checkpoint = result.state.checkpoint() }
                outcome = result
            }
            guard let outcome else { throw SimulationError(.training, "device \(assignment.device) was given no training to do") }
            let trained = outcome.model
            let diff = try Model.diff(original: start, trained: trained)
            var loss = 0.0
            if case .completed(let report) = outcome, let lastEpoch = report.epochs.last { loss = lastEpoch.loss }
            let body = ReportEnvelope.encode(
                diff: diff.records,
                metadata: ReportMetadata(workerID: assignment.worker, requestKey: assignment.handle, sampleCount: data.count, metrics: ["loss": loss])
            )
            return DeviceUpdate(device: assignment.device, diff: body, sampleCount: data.count, trainingLoss: loss, checkpointsRestored: restored)
        } catch let error as SimulationError {
            throw error
        } catch {
            throw SimulationError(.training, "device \(assignment.device) failed to train: \(error)")
        }
    }

    /// Test loss and accuracy (classifiers: cross-entropy of the softmax output) or RMSE (regressors: MSE loss).
    public func evaluate(model weights: [UInt8]) async throws(SimulationError) -> Evaluation {
        do {
            var evaluated = model
            try evaluated.loadWeights(safetensors: weights)
            return try Self.evaluate(evaluated, on: testSet, loss: training.loss)
        } catch {
            throw SimulationError(.training, "cannot evaluate the global model: \(error)")
        }
    }

    /// Evaluates a model on a dataset in batches.
    static func evaluate(_ model: Model, on data: TestSet, loss: LossType) throws(EngineError) -> Evaluation {
        let batch = 1000
        let targetWidth = data.targetSpec.elementCount
        var lossSum = 0.0, hits = 0.0, squared = 0.0
        var start = 0
        while start < data.count {
            let n = min(batch, data.count - start)
            var feeds: [String: Tensor] = [:]
            for (i, spec) in data.inputSpecs.enumerated() {
                let width = spec.elementCount
                var values = [Float](repeating: 0, count: n * width)
                values.withUnsafeMutableBufferPointer { buffer in
                    for j in 0..<n { data.copyInput(i, of: start + j, into: UnsafeMutableBufferPointer(rebasing: buffer[(j * width)..<((j + 1) * width)])) }
                }
                feeds[spec.name] = Tensor(shape: [n] + spec.shape, scalars: values)
            }
            var targets = [Float](repeating: 0, count: n * targetWidth)
            targets.withUnsafeMutableBufferPointer { buffer in
                for j in 0..<n { data.copyTarget(of: start + j, into: UnsafeMutableBufferPointer(rebasing: buffer[(j * targetWidth)..<((j + 1) * targetWidth)])) }
            }
            let output = try model(feeds)
            if loss == .crossEntropy {
                let classes = output.count / n
                for j in 0..<n {
                    let row = output.scalars[(j * classes)..<((j + 1) * classes)]
                    let label = Int(targets[j])
                    lossSum -= Foundation.log(Double(max(row[row.startIndex + label], 1e-12)))
                    if let best = row.indices.max(by: { row[$0] < row[$1] }), best - row.startIndex == label { hits += 1 }
                }
            } else {
                for (p, t) in zip(output.scalars, targets) { squared += Double((p - t) * (p - t)) }
            }
            start += n
        }
        if loss == .crossEntropy {
            return Evaluation(loss: lossSum / Double(data.count), accuracy: hits / Double(data.count))
        }
        let mse = squared / Double(data.count * targetWidth)
        return Evaluation(loss: mse, rmse: mse.squareRoot())
    }
}
