import Foundation
public import OrchardFormats
public import OrchardML
import OrchardSupport

/// How the arrays of Flower's `ArrayRecord` map onto the Orchard model's parameters. Flower ships weights, not
/// architectures, so the device says which array is which parameter; every array's shape is checked, never reshaped.
public struct ArrayMapping: Sendable, Hashable {
    /// Orchard parameter names, one per Flower array, in the order the arrays arrive (`nil`: positional, see
    /// ``positional``).
    public let parameters: [String]?
    /// Flower array name → Orchard parameter name (`nil` unless mapped by name).
    public let byName: [String: String]?

    /// The i-th Flower array is the i-th parameter in the model's layer order (within a layer its weights before its
    /// biases, as PyTorch's `state_dict()` and Keras' `get_weights()` list them; a recurrent layer's `weight_ih`,
    /// `weight_hh`, `bias_ih`, `bias_hh`, as `nn.LSTM` and `nn.GRU` list theirs); names are not compared.
    public static let positional = ArrayMapping(parameters: nil, byName: nil)

    /// The i-th Flower array is `parameters[i]`.
    public static func ordered(_ parameters: [String]) -> ArrayMapping { ArrayMapping(parameters: parameters, byName: nil) }

    /// Each Flower array is found by its name (`flower name → Orchard parameter`).
    public static func named(_ map: [String: String]) -> ArrayMapping { ArrayMapping(parameters: nil, byName: map) }

    /// Reads a mapping file: a JSON array of parameter names (in the arrays' order) or a JSON object from Flower array
    /// names to parameter names.
    public static func decode(json bytes: [UInt8]) throws(FlowerError) -> ArrayMapping {
        if let list = try? JSONDecoder().decode([String].self, from: Data(bytes)) { return .ordered(list) }
        if let map = try? JSONDecoder().decode([String: String].self, from: Data(bytes)) { return .named(map) }
        throw FlowerError(.invalidConfiguration, "an array mapping is a JSON array of parameter names or an object {\"flower name\": \"parameter\"}")
    }

    /// The parameter names of `model` in positional order.
    static func positionalNames(of model: Model) -> [String] {
        model.layers.flatMap { layer in
            layer.parameters.keys.sorted { a, b in positionalRank(a) < positionalRank(b) }.map { "\(layer.name).\($0)" }
        }
    }

    /// Weights before biases, input-side before recurrent (`_ih` before `_hh`), then by name.
    private static func positionalRank(_ suffix: String) -> (Int, Int, String) {
        (suffix.hasPrefix("bias") ? 1 : 0, suffix.hasSuffix("_hh") ? 1 : 0, suffix)
    }
}

/// One array as the local app reads and writes it: Flower's name, shape and float32 values.
public struct NamedArray: Sendable, Hashable {
    /// The name in the `ArrayRecord`.
    public var name: String
    /// The shape.
    public var shape: [Int]
    /// Row-major values.
    public var values: [Float]

    /// Creates an array.
    public init(name: String, shape: [Int], values: [Float]) {
        self.name = name
        self.shape = shape
        self.values = values
    }
}

/// What a `train` or `evaluate` message asks of the device, read from its `ConfigRecord`.
public struct RoundSettings: Sendable, Hashable {
    /// The learning rate (`lr` or `learning-rate`), when the server sets one.
    public var learningRate: Double?
    /// Local epochs (`local-epochs`).
    public var localEpochs: Int?
    /// The batch size (`batch-size`).
    public var batchSize: Int?
    /// The server round (`server-round`), used to seed the device's shuffling.
    public var serverRound: Int?

    /// Settings left to the model's own training section.
    public init(learningRate: Double? = nil, localEpochs: Int? = nil, batchSize: Int? = nil, serverRound: Int? = nil) {
        self.learningRate = learningRate
        self.localEpochs = localEpochs
        self.batchSize = batchSize
        self.serverRound = serverRound
    }
}

/// The device's side of a Flower round with the Orchard engine: loads the server's arrays into the model through the
/// mapping, trains on the local data or evaluates it, and answers with the arrays in the names and order they came.
public struct FlowerLocalApp: Sendable {
    /// The model's architecture (its `training` section gives the loss, optimizer, epochs and batch size).
    public let model: ModelSpec
    /// How Flower's arrays map onto the parameters.
    public let mapping: ArrayMapping
    /// The local samples.
    public let dataset: any Dataset
    /// Seeds the device's shuffling (mixed with the server round).
    public let seed: UInt64
    /// The arrays a message must carry: one per parameter of the model.
    public let parameterCount: Int

    /// Creates the app.
    /// - Throws: ``FlowerError/Code/invalidConfiguration`` when the model cannot be built or has no `training`
    ///   section, or the mapping names parameters the model does not have.
    public init(model: ModelSpec, mapping: ArrayMapping = .positional, dataset: any Dataset, seed: UInt64 = 0) throws(FlowerError) {
        guard model.training != nil else {
            throw FlowerError(.invalidConfiguration, "model '\(model.name)' has no training section (loss, optimizer), which a Flower device needs")
        }
        let built: Model
        do { built = try Model(spec: model) } catch {
            throw FlowerError(.invalidConfiguration, "model '\(model.name)' cannot be built: \(error.message)")
        }
        let names = Set(built.parameterNames)
        let mapped = mapping.parameters ?? mapping.byName.map { Array($0.values) } ?? []
        if let unknown = mapped.first(where: { !names.contains($0) }) {
            throw FlowerError(
                .invalidConfiguration,
                "the array mapping names '\(unknown)', which model '\(model.name)' does not have (it has \(built.parameterNames.joined(separator: ", ")))")
        }
        if Set(mapped).count != mapped.count {
            throw FlowerError(.invalidConfiguration, "the array mapping names a parameter twice")
        }
        self.model = model
        self.mapping = mapping
        self.dataset = dataset
        self.seed = seed
        parameterCount = built.parameterNames.count
    }

    /// The model with the server's arrays loaded.
    /// - Throws: ``FlowerError/Code/arrayMismatch`` naming the array when the count, a name or a shape does not match.
    public func load(_ arrays: [NamedArray]) throws(FlowerError) -> Model {
        var built: Model
        do { built = try Model(spec: model) } catch { throw FlowerError(.invalidConfiguration, error.message) }
        let targets = try parameterNames(for: arrays, in: built)
        for (array, name) in zip(arrays, targets) {
            let expected = built.parameter(name)?.shape ?? []
            guard array.shape == expected else {
                throw FlowerError(
                    .arrayMismatch, "array '\(array.name)' has shape \(array.shape), but parameter '\(name)' of model '\(model.name)' has shape \(expected)")
            }
            do { try built.setParameter(name, to: Tensor(shape: array.shape, scalars: array.values)) } catch {
                throw FlowerError(.arrayMismatch, "array '\(array.name)' cannot be loaded into '\(name)': \(error.message)")
            }
        }
        return built
    }

    /// The parameter each array goes to, checking the count and names.
    private func parameterNames(for arrays: [NamedArray], in built: Model) throws(FlowerError) -> [String] {
        let all = built.parameterNames
        if let byName = mapping.byName {
            guard arrays.count == all.count else {
                throw FlowerError(.arrayMismatch, "the server sent \(arrays.count) arrays; model '\(model.name)' has \(all.count) parameters")
            }
            var names: [String] = []
            for array in arrays {
                guard let name = byName[array.name] else {
                    throw FlowerError(
                        .arrayMismatch, "array '\(array.name)' is not in the array mapping (it maps \(byName.keys.sorted().joined(separator: ", ")))")
                }
                names.append(name)
            }
            return names
        }
        let names = mapping.parameters ?? ArrayMapping.positionalNames(of: built)
        guard arrays.count == names.count, names.count == all.count else {
            throw FlowerError(
                .arrayMismatch,
                "the server sent \(arrays.count) arrays; model '\(model.name)' has \(all.count) parameters (\(ArrayMapping.positionalNames(of: built).joined(separator: ", ")))"
            )
        }
        return names
    }

    /// The model's parameters as arrays named and ordered like `template` (the arrays the server sent).
    public func arrays(of trained: Model, like template: [NamedArray]) throws(FlowerError) -> [NamedArray] {
        let names = try parameterNames(for: template, in: trained)
        return zip(template, names).map { array, name in
            NamedArray(name: array.name, shape: array.shape, values: trained.parameter(name)?.scalars ?? [])
        }
    }

    /// Trains on the local data from the server's arrays: the updated arrays, and the metrics of the reply
    /// (`num-examples`: the examples trained on, at most the dataset's; `train_loss`).
    /// - Throws: ``FlowerError`` `.arrayMismatch`, `.invalidConfiguration` (settings out of range), `.training`,
    ///   `.cancelled` (the window ended: stopped at a batch boundary).
    public func train(_ arrays: [NamedArray], settings: RoundSettings) throws(FlowerError) -> (arrays: [NamedArray], metrics: [String: Double]) {
        let start = try load(arrays)
        guard let spec = model.training else { throw FlowerError(.invalidConfiguration, "model '\(model.name)' has no training section") }
        var configuration = TrainingConfiguration(spec, seed: seed &+ UInt64(max(settings.serverRound ?? 0, 0)))
        if let lr = settings.learningRate {
            guard lr > 0, lr.isFinite else { throw FlowerError(.invalidConfiguration, "the learning rate must be positive, not \(lr)") }
            configuration.optimizer.learningRate = lr
        }
        if let epochs = settings.localEpochs {
            guard (1...ModelSpec.maximumEpochs).contains(epochs) else {
                throw FlowerError(.invalidConfiguration, "local-epochs must be in 1...\(ModelSpec.maximumEpochs), not \(epochs)")
            }
            configuration.epochs = epochs
        }
        if let batch = settings.batchSize {
            guard (1...ModelSpec.maximumBatchSize).contains(batch) else {
                throw FlowerError(.invalidConfiguration, "batch-size must be in 1...\(ModelSpec.maximumBatchSize), not \(batch)")
            }
            configuration.batchSize = batch
        }
        let outcome: TrainingOutcome
        do {
            outcome = try Trainer(model: start, configuration: configuration).train(on: dataset)
        } catch  where error.code == .cancelled {
            throw FlowerError(.cancelled, "training stopped: \(error.message)")
        } catch {
            throw FlowerError(.training, "local training failed: \(error.message)")
        }
        guard case .completed(let report) = outcome else { throw FlowerError(.cancelled, "training stopped before the end of its epochs") }
        // The examples this update was trained on: all of them once an epoch completes, fewer when the model's
        // `training.max_updates` stopped it inside the first (FedAvg weighs the reply by this).
        let seen = report.epochs.reduce(0) { $0 + $1.samples }
        var metrics: [String: Double] = ["num-examples": Double(min(dataset.count, seen))]
        if let last = report.epochs.last { metrics["train_loss"] = last.loss }
        return (try self.arrays(of: report.model, like: arrays), metrics)
    }

    /// Evaluates the server's arrays on the local data: `num-examples`, `eval_loss` and (classifiers) `eval_acc`.
    public func evaluate(_ arrays: [NamedArray]) throws(FlowerError) -> [String: Double] {
        let loaded = try load(arrays)
        guard let loss = model.training?.loss else { throw FlowerError(.invalidConfiguration, "model '\(model.name)' has no training section") }
        do {
            let result = try loaded.evaluate(on: dataset, loss: loss)
            var metrics = ["num-examples": Double(dataset.count), "eval_loss": result.loss]
            if let accuracy = result.accuracy { metrics["eval_acc"] = accuracy }
            return metrics
        } catch {
            throw FlowerError(.training, "evaluation failed: \(error.message)")
        }
    }
}
