import OrchardSupport
public import OrchardFormats

/// A model compiled for a batch size: every activation, gradient, parameter and scratch buffer allocated once.
///
/// The plan holds the parameters as one flat vector ordered by name (the same layout as
/// ``Model/flatParameters()``) and their gradients alongside. `forward(batch:training:)` and
/// `backward(batch:descentRate:)` allocate nothing. Frozen layers compute no weight gradients, and no layer computes an
/// input gradient that no trainable parameter needs, so layers before the first trainable one do no backward
/// work at all. Not thread-safe: one plan belongs to one training run.
public final class CompiledModel {
    typealias Ptr = UnsafeMutablePointer<Float>

    /// The model the plan was compiled from (its parameters are not kept current; see ``exportModel()``).
    public let model: Model
    /// The largest batch the buffers hold.
    public let batchCapacity: Int
    /// The loss the plan computes.
    public let loss: LossType
    /// Parameter names in flat order.
    public let parameterNames: [String]
    /// Offset of each parameter in the flat vector, by name.
    public let parameterOffsets: [String: Int]
    /// Total number of parameter values.
    public let parameterCount: Int
    /// Whether each parameter (flat order) is trained.
    public let parameterTrainable: [Bool]

    /// The flat parameter vector.
    let parameters: Ptr
    /// The flat gradient vector (entries of frozen parameters stay zero).
    let gradients: Ptr
    /// Trainable stretches of the flat vector.
    let trainableRanges: [Range<Int>]
    /// Trainable stretches whose update the optimizer still applies when
    /// ``backward(batch:descentRate:)`` takes the plain SGD step inside the dense layers.
    let rangesNotUpdatedInBackward: [Range<Int>]
    /// One buffer per model input, `batchCapacity × perSample`.
    let inputBuffers: [Ptr]
    /// Per-sample element count of each input.
    let inputCounts: [Int]
    /// The target buffer, `batchCapacity × targetCount`.
    let targets: Ptr
    /// Per-sample target element count.
    let targetCount: Int
    /// Per-sample output element count.
    let outputCount: Int
    /// Whether cross-entropy is fused with a final softmax layer.
    let fusedSoftmax: Bool
    /// Cross-entropy's classes (the output's last axis); 0 for MSE.
    let classCount: Int
    /// Random stream for dropout masks.
    var dropoutRandom: OrchardRandom

    private let nodes: [PlanNode]
    private let outputNode: PlanNode
    /// The plan whose parameter vector this one reads (a batch shard's replica), kept alive with it.
    private let parameterOwner: CompiledModel?
    /// Scratch probabilities when cross-entropy reads logits from a non-softmax output.
    private let probabilities: Ptr?
    private var allocations: [UnsafeMutableRawPointer] = []

    /// Compiles `model` for batches of up to `batchCapacity` samples.
    /// - Parameters:
    ///   - model: The model; its parameters are copied into the plan.
    ///   - batchCapacity: The largest batch.
    ///   - loss: The loss to compute; `crossEntropy` needs class-index targets of shape `[1]`.
    ///   - targetShape: The per-sample target shape (defaults to `[1]` for cross-entropy, the output shape for MSE).
    ///   - dropoutSeed: Seed of the dropout mask stream.
    public convenience init(model: Model, batchCapacity: Int, loss: LossType, targetShape: [Int]? = nil, dropoutSeed: UInt64 = 0) throws(EngineError) {
        try self.init(model: model, batchCapacity: batchCapacity, loss: loss, targetShape: targetShape, dropoutSeed: dropoutSeed, sharingParametersOf: nil)
    }

    /// A plan for forward passes only (``Model/predict(_:batchSize:)``): no gradient buffers, which for an evaluation
    /// batch of 1,000 are about half of what a training plan allocates and zero-fills.
    convenience init(inferenceOf model: Model, batchCapacity: Int) throws(EngineError) {
        try self.init(
            model: model, batchCapacity: batchCapacity, loss: .meanSquaredError, targetShape: nil, dropoutSeed: 0, sharingParametersOf: nil, inferenceOnly: true
        )
    }

    /// A replica of `owner` for batch shards: its own activations and gradient vector, `owner`'s parameter vector
    /// (read while both run forward and backward; updated only between steps).
    convenience init(replicaOf owner: CompiledModel, batchCapacity: Int) throws(EngineError) {
        try self.init(model: owner.model, batchCapacity: batchCapacity, loss: owner.loss, targetShape: nil, dropoutSeed: 0, sharingParametersOf: owner)
    }

    private init(
        model: Model, batchCapacity: Int, loss: LossType, targetShape: [Int]?, dropoutSeed: UInt64, sharingParametersOf owner: CompiledModel?,
        inferenceOnly: Bool = false
    ) throws(EngineError) {
        guard batchCapacity > 0 else { throw EngineError(.invalidArgument, "batch size must be positive, not \(batchCapacity)") }
        guard loss == .meanSquaredError || loss == .crossEntropy else {
            throw EngineError(.invalidArgument, "unknown loss '\(loss)'")
        }
        self.model = model
        self.batchCapacity = batchCapacity
        self.loss = loss
        self.dropoutRandom = OrchardRandom.derived(seed: dropoutSeed, stream: 0xD0)

        // Parameters: one flat vector in name order.
        let named = model.namedParameters
        let names = named.keys.sorted()
        let trainableNames = Set(model.trainableParameterNames)
        var offsets: [String: Int] = [:]
        var total = 0
        for name in names {
            offsets[name] = total
            total += named[name]!.count
        }
        parameterNames = names
        parameterOffsets = offsets
        parameterCount = total
        parameterTrainable = names.map { trainableNames.contains($0) }
        trainableRanges = Self.ranges(of: names.filter(trainableNames.contains), offsets: offsets, sizes: named.mapValues(\.count))

        var allocations: [UnsafeMutableRawPointer] = []
        func allocate(_ count: Int) -> Ptr {
            let p = Ptr.allocate(capacity: max(count, 1))
            p.initialize(repeating: 0, count: max(count, 1))
            allocations.append(UnsafeMutableRawPointer(p))
            return p
        }
        let params = owner?.parameters ?? allocate(total)
        let grads = allocate(total)
        parameters = params
        gradients = grads
        parameterOwner = owner
        if owner == nil {
            for name in names {
                named[name]!.withUnsafeBufferPointer { (params + offsets[name]!).update(from: $0.baseAddress!, count: $0.count) }
            }
        }

        // Values: inputs and layer outputs.
        var values: [String: Ptr] = [:]
        var buffers: [Ptr] = []
        for input in model.inputs {
            let p = allocate(batchCapacity * input.shape.reduce(1, *))
            values[input.name] = p
            buffers.append(p)
        }
        inputBuffers = buffers
        inputCounts = model.inputs.map { $0.shape.reduce(1, *) }

        // Keep only layers the output depends on.
        var needed: Set<String> = [model.output]
        for layer in model.layers.reversed() where needed.contains(layer.name) { needed.formUnion(layer.inputNames) }
        let layers = model.layers.filter { needed.contains($0.name) }

        // Which values need a gradient: those computed from a trainable parameter.
        var needsGradient: Set<String> = []
        for layer in layers where !inferenceOnly {
            let trainable = !layer.isFrozen && !layer.parameters.isEmpty
            if trainable || layer.inputNames.contains(where: needsGradient.contains) { needsGradient.insert(layer.name) }
        }
        var gradientBuffers: [String: Ptr] = [:]
        for layer in layers {
            let count = model.shapes[layer.name]!.reduce(1, *)
            values[layer.name] = allocate(batchCapacity * count)
            if needsGradient.contains(layer.name) { gradientBuffers[layer.name] = allocate(batchCapacity * count) }
        }

        // Gradient writers in backward order: the first overwrites, later ones add.
        var written: Set<String> = []
        var accumulateFlags: [String: [Bool]] = [:]
        let outputLayer = layers.last { $0.name == model.output }!
        let fused = loss == .crossEntropy && outputLayer is Softmax
        for layer in layers.reversed() where needsGradient.contains(layer.name) {
            if fused && layer.name == model.output {
                // The fused loss writes the softmax's input gradient itself.
                accumulateFlags[layer.name] = layer.inputNames.map { !written.insert($0).inserted }
                continue
            }
            accumulateFlags[layer.name] = layer.inputNames.map { name in
                guard gradientBuffers[name] != nil else { return false }
                return !written.insert(name).inserted
            }
        }

        var nodes: [PlanNode] = []
        for layer in layers {
            let inputShapes = layer.inputNames.map { model.shapes[$0]! }
            let node = try PlanNode(
                layer: layer, inputShapes: inputShapes, outputShape: model.shapes[layer.name]!,
                inputs: layer.inputNames.map { values[$0]! },
                inputGradients: layer.inputNames.map { gradientBuffers[$0] },
                accumulate: accumulateFlags[layer.name] ?? layer.inputNames.map { _ in false },
                output: values[layer.name]!, outputGradient: gradientBuffers[layer.name],
                parameterOffsets: offsets,
                parameters: params, gradients: grads, batchCapacity: batchCapacity, allocate: allocate
            )
            nodes.append(node)
        }
        self.nodes = nodes
        let updatedInBackward = Set(nodes.filter(\.updatesParametersInBackward).flatMap { ["\($0.name).weight", "\($0.name).bias"] })
        rangesNotUpdatedInBackward = Self.ranges(
            of: names.filter { trainableNames.contains($0) && !updatedInBackward.contains($0) }, offsets: offsets, sizes: named.mapValues(\.count))
        self.outputNode = nodes.last { $0.name == model.output }!
        self.fusedSoftmax = fused
        outputCount = model.outputShape.reduce(1, *)

        let expectedTarget: [Int]
        if loss == .crossEntropy {
            guard let classes = model.outputShape.last, classes > 0 else {
                throw EngineError(.invalidModel, "cross-entropy needs an output of class scores on its last axis, got \(model.outputShape)")
            }
            // One class index per sample, or one per position of a sequence output ([T, classes] → [T]).
            expectedTarget = model.outputShape.count == 1 ? [1] : Array(model.outputShape.dropLast())
            classCount = classes
        } else {
            classCount = 0
            expectedTarget = model.outputShape
        }
        if let targetShape, targetShape.reduce(1, *) != expectedTarget.reduce(1, *) {
            throw EngineError(
                .shapeMismatch, "targets of shape \(targetShape) do not fit loss \(loss) on output \(model.outputShape) (expected \(expectedTarget))")
        }
        targetCount = expectedTarget.reduce(1, *)
        targets = allocate(batchCapacity * targetCount)
        probabilities = (loss == .crossEntropy && !fused) ? allocate(batchCapacity * outputCount) : nil
        self.allocations = allocations
    }

    deinit {
        for p in allocations { p.deallocate() }
    }

    /// The stretches of the flat vector the named parameters (in flat order) cover, adjacent ones merged.
    private static func ranges(of names: [String], offsets: [String: Int], sizes: [String: Int]) -> [Range<Int>] {
        var ranges: [Range<Int>] = []
        for name in names {
            let start = offsets[name]!, end = start + sizes[name]!
            if let last = ranges.last, last.upperBound == start { ranges[ranges.count - 1] = last.lowerBound..<end } else { ranges.append(start..<end) }
        }
        return ranges
    }

    /// Runs the layers on the first `batch` samples of the input buffers.
    func forward(batch: Int, training: Bool) throws(EngineError) {
        for node in nodes { try node.forward(batch: batch, training: training, random: &dropoutRandom) }
    }

    /// The output buffer (probabilities when the model ends in softmax).
    var output: UnsafeMutablePointer<Float> { outputNode.output }

    /// Computes the loss of the current forward pass and writes the output gradient. Returns the summed
    /// per-sample loss (divide by `batch` for the mean); the gradient is of the loss summed over the batch and
    /// divided by `meanOver` (the batch itself by default; the whole batch when this one is a shard of it).
    func lossAndGradient(batch: Int, meanOver: Int? = nil) throws(EngineError) -> Double {
        let divisor = meanOver ?? batch
        let out = outputNode.output
        let n = outputCount
        var total = 0.0
        if loss == .meanSquaredError {
            let scale = 2 / Float(divisor * n)
            let grad = outputNode.outputGradient
            for i in 0..<(batch * n) {
                let d = out[i] - targets[i]
                total += Double(d * d)
                grad?[i] = scale * d
            }
            return total / Double(n)
        }
        // Cross-entropy over class indices: probabilities p (softmax output, or computed here from logits). A sequence
        // output has one class row per position; a sample's loss is the mean over its positions whose target is not
        // the padding marker −1 (a sample of padding only adds nothing).
        let classes = classCount
        let positions = n / classes
        let p: UnsafeMutablePointer<Float>
        let logits: UnsafeMutablePointer<Float>
        if fusedSoftmax {
            p = out
            logits = outputNode.inputs[0]
        } else {
            p = probabilities!
            logits = out
            Ops.softmaxForward(rows: batch * positions, width: classes, x: logits, y: p)
        }
        let grad: UnsafeMutablePointer<Float>? = fusedSoftmax ? outputNode.inputGradients[0] : outputNode.outputGradient
        let accumulate = fusedSoftmax ? outputNode.accumulate[0] : false
        for b in 0..<batch {
            var counted = 0
            for position in 0..<positions {
                let t = targets[b * positions + position]
                if positions > 1 && t == Self.paddingTarget { continue }
                guard t >= 0, t < Float(classes), t == t.rounded(.towardZero) else {
                    throw EngineError(
                        .invalidArgument,
                        "class index \(t) is not in 0..<\(classes)\(positions > 1 ? " (or \(Int(Self.paddingTarget)) for padding)" : "")")
                }
                counted += 1
            }
            let scale = counted == 0 ? 0 : 1 / Float(divisor * counted)
            var sampleLoss = 0.0
            for position in 0..<positions {
                let row = b * positions + position
                let t = targets[row]
                let r = logits + row * classes
                if let grad, !accumulate, t == Self.paddingTarget, positions > 1 {
                    (grad + row * classes).update(repeating: 0, count: classes)
                }
                guard !(positions > 1 && t == Self.paddingTarget) else { continue }
                let label = Int(t)
                let probability = p[row * classes + label]
                if probability >= 1e-30 {
                    // −log of the softmax's own probability: the log-sum-exp without its exponentials again.
                    sampleLoss -= Double(probability).logarithm
                } else {
                    // The probability underflowed: the log-sum-exp from the logits.
                    var m = -Float.infinity
                    for j in 0..<classes { m = max(m, r[j]) }
                    var s: Double = 0
                    for j in 0..<classes { s += Double(expLocal(r[j] - m)) }
                    sampleLoss += (s.logarithm + Double(m)) - Double(r[label])
                }
                if let grad {
                    let pr = p + row * classes, gr = grad + row * classes
                    for j in 0..<classes {
                        let g = scale * (pr[j] - (j == label ? 1 : 0))
                        if accumulate { gr[j] += g } else { gr[j] = g }
                    }
                }
            }
            total += counted == 0 ? 0 : sampleLoss / Double(counted)
        }
        return total
    }

    /// The target that marks a padded position of a sequence (PyTorch's `ignore_index`, here −1): it adds nothing to
    /// the loss, its gradient or the metrics.
    public static let paddingTarget: Float = -1

    /// Back-propagates the output gradient written by ``lossAndGradient(batch:)``.
    ///
    /// With `descentRate`, every trained dense layer takes the plain SGD step `w -= descentRate · g` on its weight
    /// and bias as soon as its input gradient is computed, and does not store those gradients; the optimizer then
    /// updates only ``rangesNotUpdatedInBackward``. The result is the same as storing the gradients and
    /// stepping afterwards, with less memory traffic.
    func backward(batch: Int, descentRate: Float? = nil) {
        for node in nodes.reversed() where node.doesBackward {
            if fusedSoftmax && node === outputNode { continue }
            node.backward(batch: batch, descentRate: descentRate)
        }
    }

    /// A copy of the model carrying the plan's current parameters.
    public func exportModel() -> Model {
        var m = model
        for name in parameterNames {
            let shape = model.parameterShapes[name]!
            let count = shape.reduce(1, *)
            let values = Array(UnsafeBufferPointer(start: parameters + parameterOffsets[name]!, count: count))
            try! m.setParameter(name, to: Tensor(shape: shape, scalars: values))
        }
        return m
    }

    /// Overwrites the plan's parameters with a model's, which must have the same parameter names and shapes.
    public func loadParameters(from other: Model) throws(EngineError) {
        let named = other.namedParameters
        guard named.keys.sorted() == parameterNames else {
            throw EngineError(.incompatibleCheckpoint, "parameters \(named.keys.sorted()) do not match the plan's \(parameterNames)")
        }
        for name in parameterNames {
            let t = named[name]!
            guard t.shape == model.parameterShapes[name]! else {
                throw EngineError(.incompatibleCheckpoint, "parameter '\(name)' has shape \(t.shape), expected \(model.parameterShapes[name]!)")
            }
            t.withUnsafeBufferPointer { (parameters + parameterOffsets[name]!).update(from: $0.baseAddress!, count: $0.count) }
        }
    }

    /// The current parameters as one flat vector (name order).
    public func flatParameters() -> [Float] { Array(UnsafeBufferPointer(start: parameters, count: parameterCount)) }

    /// Replaces the parameters from one flat vector (name order).
    public func setFlatParameters(_ values: [Float]) throws(EngineError) {
        guard values.count == parameterCount else {
            throw EngineError(.shapeMismatch, "the plan has \(parameterCount) parameter values, not \(values.count)")
        }
        values.withUnsafeBufferPointer { parameters.update(from: $0.baseAddress!, count: parameterCount) }
    }

    /// The gradients of the last backward pass as one flat vector (name order; zero for frozen parameters). A
    /// ``Trainer`` with plain SGD steps dense layers during back-propagation without storing their gradients, so
    /// after its training those entries hold whatever ``computeGradients(inputs:targets:)`` last wrote.
    public func flatGradients() -> [Float] { Array(UnsafeBufferPointer(start: gradients, count: parameterCount)) }

    /// Copies inputs and targets for `batch` samples into the plan's buffers, runs forward, loss and backward,
    /// and returns the mean loss. Allocates (for the copies); meant for tests and tools, not the training loop.
    public func computeGradients(inputs: [String: Tensor], targets target: Tensor) throws(EngineError) -> Float {
        let batch = target.shape.first ?? 0
        guard batch > 0, batch <= batchCapacity, target.count == batch * targetCount else {
            throw EngineError(.shapeMismatch, "targets of shape \(target.shape) do not fit \(targetCount) values per sample and batch ≤ \(batchCapacity)")
        }
        for (i, input) in model.inputs.enumerated() {
            guard let t = inputs[input.name], t.count == batch * inputCounts[i] else {
                throw EngineError(.shapeMismatch, "input '\(input.name)' needs \(batch) × \(input.shape)")
            }
            t.withUnsafeBufferPointer { inputBuffers[i].update(from: $0.baseAddress!, count: $0.count) }
        }
        target.withUnsafeBufferPointer { targets.update(from: $0.baseAddress!, count: $0.count) }
        try forward(batch: batch, training: true)
        let total = try lossAndGradient(batch: batch)
        backward(batch: batch)
        return Float(total / Double(batch))
    }
}

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

@inline(__always) func expLocal(_ x: Float) -> Float { expf(x) }

extension Double {
    /// Natural logarithm.
    var logarithm: Double { log(self) }
}
