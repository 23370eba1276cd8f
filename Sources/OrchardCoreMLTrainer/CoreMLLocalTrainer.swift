// Local training with Core ML's MLUpdateTask. One branch: on Apple platforms it builds against the real Core ML; on
// Linux against the shim that Package.swift aliases to `CoreML`.
import CoreML
import Foundation
public import OrchardClient
public import OrchardFormats
public import OrchardML
public import OrchardSupport
import OrchardCoreML
import Synchronization

/// A ``OrchardClient/LocalTrainer`` that trains with Core ML on the device: it turns the cycle's model into an
/// updatable `.mlmodel` (``OrchardCoreML/CoreMLExporter``, with the task's loss, optimizer, learning rate, batch size
/// and epochs), compiles it, runs an `MLUpdateTask` over the local samples, and reads the updated weights and biases
/// of every trainable dense and convolution layer back (`parameterValue(for: .weights.scoped(to:))`). The diff is
/// updated − received; frozen layers are left out of training, so their diff is zero.
///
/// Core ML cannot stop at a batch and resume: a cancelled run is cancelled (`.cancelled`), not interrupted, and
/// `pauseAfterUpdates` is not supported. A task with an update cap (`max_updates`) is refused: Core ML has none; so is
/// one with FedProx's `proximal_mu` above 0: Core ML's loss layers have no proximal term.
///
/// Waiting for Core ML suspends the Swift task (no thread is blocked). Cancelling it cancels the `MLUpdateTask`, whose
/// completion handler Apple does not promise to call afterwards: the run ends with `.cancelled` when the handler
/// reports the cancellation or ``cancellationGrace`` after the cancellation, whichever comes first, so a background
/// window's expiry is met in time.
public struct CoreMLLocalTrainer: LocalTrainer {
    /// How long a cancelled run waits for Core ML to confirm before it ends anyway.
    public var cancellationGrace: Duration
    /// The clock the grace is measured on.
    public var clock: any WallClock

    /// Creates a trainer.
    public init(cancellationGrace: Duration = .seconds(2), clock: any WallClock = SystemClock()) {
        self.cancellationGrace = cancellationGrace
        self.clock = clock
    }

    public func parameterShapes(of spec: ModelSpec) throws(OrchardClientError) -> [String: [Int]] {
        do {
            return Dictionary(uniqueKeysWithValues: try spec.parameters().map { ($0.name, $0.shape) })
        } catch {
            throw OrchardClientError(.incompatibleModel, "the model's parameters cannot be laid out: \(error.message)")
        }
    }

    public func completedUpdates(in checkpoint: [UInt8], of task: LocalTrainingTask) throws(OrchardClientError) -> Int {
        throw OrchardClientError(.training, "Core ML training keeps no checkpoint to resume from")
    }

    public func train(
        _ task: LocalTrainingTask, on dataset: any Dataset, resumingFrom checkpoint: [UInt8]?,
        progress: @escaping @Sendable (TrainingStep) -> Void
    ) async throws(OrchardClientError) -> LocalTrainingOutcome {
        guard checkpoint == nil else { throw OrchardClientError(.training, "Core ML training cannot resume from a checkpoint") }
        guard task.pauseAfterUpdates == nil else { throw OrchardClientError(.invalidConfiguration, "Core ML training cannot pause after a number of updates") }
        let training = task.training
        guard training.maxUpdates == nil else {
            throw OrchardClientError(.incompatibleModel, "the process caps updates (max_updates \(training.maxUpdates!)); Core ML has no update cap")
        }
        guard training.proximalMu == 0 else {
            throw OrchardClientError(
                .incompatibleModel, "the process trains with FedProx (proximal_mu \(training.proximalMu)); Core ML's training has no proximal term")
        }
        guard dataset.count > 0 else { throw OrchardClientError(.training, "the local dataset is empty") }
        var spec = task.model.spec
        spec.training = TrainingSpec(loss: training.loss, optimizer: training.optimizer, epochs: training.epochs, batchSize: training.batchSize)
        let file: [UInt8]
        do { file = try CoreMLExporter().export(spec, weights: task.model.weights) } catch {
            throw OrchardClientError(.incompatibleModel, "the model cannot be trained with Core ML: \(error.description)")
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-coreml-\(UUID().uuidString)")
        // The model's files are Core ML's until its update task is done with them: removed when the task calls back (or
        // when it never started); a cancelled task that never confirms leaves them in the temporary directory.
        var scratch = Scratch(urls: [directory])
        defer { scratch.removeUnlessHandedOver() }
        let compiled: URL
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let source = directory.appendingPathComponent("model.mlmodel")
            try Data(file).write(to: source)
            compiled = try await MLModel.compileModel(at: source)
        } catch {
            throw OrchardClientError(.training, "Core ML cannot compile the model: \(error)")
        }
        scratch.urls.append(compiled)
        let samples = try Self.batch(dataset, spec: spec)
        let configuration = MLModelConfiguration()
        configuration.parameters = [
            .learningRate: training.optimizer.learningRate, .miniBatchSize: training.batchSize, .epochs: training.epochs,
            .shuffle: training.shuffle,
        ]
        let updated = try await run(model: compiled, samples: samples, configuration: configuration, scratch: &scratch)
        var diff: [TensorRecord] = []
        for tensor in task.model.weights {
            let parts = tensor.name.split(separator: ".", maxSplits: 1).map(String.init)
            guard parts.count == 2, let layer = spec.layers.first(where: { $0.name == parts[0] }) else {
                throw OrchardClientError(.incompatibleModel, "tensor '\(tensor.name)' names no layer of the model")
            }
            let trainable = !layer.frozen && (layer.type == .dense || layer.type == .conv2d)
            guard trainable else {
                diff.append(TensorRecord(name: tensor.name, shape: tensor.shape, values: Array(repeating: 0, count: tensor.values.count)))
                continue
            }
            let key: MLParameterKey = parts[1] == "bias" ? .biases : .weights
            let values = try Self.values(of: updated, key.scoped(to: layer.name), count: tensor.values.count)
            diff.append(TensorRecord(name: tensor.name, shape: tensor.shape, values: zip(values, tensor.values).map { $0 - $1 }))
        }
        return .completed(LocalUpdate(diff: diff, sampleCount: dataset.count))
    }

    /// The samples as Core ML features: one multi-array per model input (per-sample shape), and the target
    /// `<output>_true` (a class index for cross-entropy, the output's values for mean squared error).
    static func batch(_ dataset: any Dataset, spec: ModelSpec) throws(OrchardClientError) -> MLArrayBatchProvider {
        let inputs = dataset.inputSpecs
        guard Set(inputs.map(\.name)) == Set(spec.inputs.map(\.name)) else {
            throw OrchardClientError(.incompatibleModel, "the dataset's inputs \(inputs.map(\.name)) are not the model's \(spec.inputs.map(\.name))")
        }
        let targetCount = dataset.targetSpec.shape.reduce(1, *)
        let crossEntropy = spec.training?.loss == .crossEntropy
        var providers: [any MLFeatureProvider] = []
        providers.reserveCapacity(dataset.count)
        do {
            for index in 0..<dataset.count {
                var features: [String: Any] = [:]
                for (position, input) in inputs.enumerated() {
                    let count = input.shape.reduce(1, *)
                    var values = [Float](repeating: 0, count: count)
                    values.withUnsafeMutableBufferPointer { dataset.copyInput(position, of: index, into: $0) }
                    let array = try MLMultiArray(shape: input.shape.map { NSNumber(value: $0) }, dataType: .double)
                    for (i, value) in values.enumerated() { array[i] = NSNumber(value: Double(value)) }
                    features[input.name] = array
                }
                var target = [Float](repeating: 0, count: targetCount)
                target.withUnsafeMutableBufferPointer { dataset.copyTarget(of: index, into: $0) }
                if crossEntropy {
                    let label = try MLMultiArray(shape: [1], dataType: .int32)
                    label[0] = NSNumber(value: Int32(target[0]))
                    features["\(spec.output)_true"] = label
                } else {
                    let array = try MLMultiArray(shape: [NSNumber(value: targetCount)], dataType: .double)
                    for (i, value) in target.enumerated() { array[i] = NSNumber(value: Double(value)) }
                    features["\(spec.output)_true"] = array
                }
                providers.append(try MLDictionaryFeatureProvider(dictionary: features))
            }
        } catch let error as OrchardClientError {
            throw error
        } catch {
            throw OrchardClientError(.training, "cannot build Core ML features from the dataset: \(error)")
        }
        return MLArrayBatchProvider(array: providers)
    }

    /// How a run ends: Core ML's completion, or the cancellation's bound.
    private enum RunEnd: Sendable {
        case finished(MLUpdateContextBox)
        case cancelled
    }

    /// Core ML's context crosses from its queue to the waiting task once.
    private struct MLUpdateContextBox: @unchecked Sendable { let context: MLUpdateContext }

    /// The one continuation of a run, resumed by whichever end comes first.
    private final class RunWaiter: Sendable {
        private struct State {
            var continuation: CheckedContinuation<RunEnd, Never>?
            var ended: RunEnd?
        }
        private let state = Mutex(State())

        func wait() async -> RunEnd {
            await withCheckedContinuation { continuation in
                let early = state.withLock { s -> RunEnd? in
                    if let ended = s.ended { return ended }
                    s.continuation = continuation
                    return nil
                }
                if let early { continuation.resume(returning: early) }
            }
        }

        /// Ends the run; `false` when it had ended already.
        @discardableResult
        func end(_ end: RunEnd) -> Bool {
            let (first, continuation) = state.withLock { s -> (Bool, CheckedContinuation<RunEnd, Never>?) in
                guard s.ended == nil else { return (false, nil) }
                s.ended = end
                defer { s.continuation = nil }
                return (true, s.continuation)
            }
            continuation?.resume(returning: end)
            return first
        }
    }

    /// Files to remove once Core ML is done with them.
    private struct Scratch: Sendable {
        var urls: [URL]
        var handedOver = false
        func remove() { for url in urls { try? FileManager.default.removeItem(at: url) } }
        func removeUnlessHandedOver() { if !handedOver { remove() } }
    }

    /// Runs an update task to its end and returns the updated model. Cancelling the Swift task cancels the update task
    /// and ends the run within ``cancellationGrace``; a task cancelled before it started is not started. When the run
    /// ends by the bound, `scratch` is handed over to Core ML's completion handler.
    private func run(
        model: URL, samples: MLArrayBatchProvider, configuration: MLModelConfiguration, scratch: inout Scratch
    ) async throws(OrchardClientError) -> MLModel {
        let waiter = RunWaiter()
        let task: MLUpdateTask
        let files = scratch
        do {
            task = try MLUpdateTask(forModelAt: model, trainingData: samples, configuration: configuration) { context in
                // Core ML confirmed after the run ended without it: the files are its to clean up now.
                if !waiter.end(.finished(MLUpdateContextBox(context: context))) { files.remove() }
            }
        } catch {
            throw OrchardClientError(.training, "Core ML cannot start the update task: \(error)")
        }
        nonisolated(unsafe) let updateTask = task
        let clock = self.clock
        let grace = cancellationGrace
        let bound = Mutex<Task<Void, Never>?>(nil)
        let started = Mutex(false)
        let end = await withTaskCancellationHandler {
            // Cancelled while the model was prepared: Core ML is never asked to train.
            guard !Task.isCancelled else { return RunEnd.cancelled }
            started.withLock { $0 = true }
            updateTask.resume()
            return await waiter.wait()
        } onCancel: {
            updateTask.cancel()
            bound.withLock {
                $0 = Task {
                    try? await clock.sleep(for: grace)
                    waiter.end(.cancelled)
                }
            }
        }
        bound.withLock { $0?.cancel() }
        // Ended by the bound while Core ML still had the task: the files stay until it calls back, if it ever does.
        if case .cancelled = end, started.withLock({ $0 }) { scratch.handedOver = true }
        guard case .finished(let box) = end else {
            throw OrchardClientError(.cancelled, "the Core ML update task was cancelled and did not confirm within \(grace)")
        }
        let context = box.context
        switch context.task.state {
        case .completed:
            return context.model
        case .cancelling:
            throw OrchardClientError(.cancelled, "the Core ML update task was cancelled")
        default:
            throw OrchardClientError(.training, "the Core ML update task failed: \(context.task.error.map { "\($0)" } ?? "no reason given")")
        }
    }

    /// The updated values of a layer's parameter.
    private static func values(of model: MLModel, _ key: MLParameterKey, count: Int) throws(OrchardClientError) -> [Float] {
        let array: MLMultiArray
        do {
            guard let value = try model.parameterValue(for: key) as? MLMultiArray else {
                throw OrchardClientError(.training, "Core ML's value of \(key) is not a multi-array")
            }
            array = value
        } catch let error as OrchardClientError {
            throw error
        } catch {
            throw OrchardClientError(.training, "Core ML has no updated value of \(key): \(error)")
        }
        guard array.count == count else { throw OrchardClientError(.training, "Core ML's \(key) has \(array.count) values, the model's \(count)") }
        let values = (0..<count).map { Float(truncating: array[$0]) }
        guard values.allSatisfy(\.isFinite) else { throw OrchardClientError(.training, "Core ML's \(key) holds a non-finite value after training") }
        return values
    }
}
