public import OrchardFormats
public import OrchardSupport

// Recurrent layers over batch-first sequences `[T, inputSize]` per sample (PyTorch's `batch_first=True`): an LSTM
// (optionally with coupled input and forget gates, CIFG) and a GRU. Their parameters are PyTorch's, named as one layer
// of `nn.LSTM`/`nn.GRU` names them without the `_l0` suffix: `weight_ih` `[gates × units, inputSize]`, `weight_hh`
// `[gates × units, units]`, `bias_ih` and `bias_hh` `[gates × units]`, gates in PyTorch's order (LSTM i, f, g, o;
// CIFG i, g, o; GRU r, z, n). A stacked PyTorch module's layer k maps onto the k-th Orchard layer.

/// What the LSTM and the GRU share: the sizes, the four parameters, building, the spec and the inference pass.
public protocol RecurrentLayer: Layer {
    /// The hidden state's width.
    var units: Int { get }
    /// The width of each step's input; 0 until built.
    var inputSize: Int { get }
    /// Whether the output is every step's hidden state `[T, units]` or the last step's `[units]`.
    var returnSequences: Bool { get }
    /// Whether the layer has the two biases.
    var useBias: Bool { get }
    /// The cell the kernels run.
    var cell: RecurrentCell { get }
    /// The parameters by suffix, as ``Layer/parameters`` gives them (``Layer/setParameter(_:to:)`` checks a new one's
    /// shape; building fills them in).
    var storage: [String: Tensor] { get set }
    /// Records the input width found when building.
    mutating func setInputSize(_ size: Int)
}

extension RecurrentLayer {
    /// Gate rows per unit.
    var gates: Int { cell == .lstm ? 4 : 3 }

    /// The shape each parameter has for an input width.
    func parameterShapes(inputSize: Int) -> [String: [Int]] {
        var shapes = ["weight_ih": [gates * units, inputSize], "weight_hh": [gates * units, units]]
        if useBias {
            shapes["bias_ih"] = [gates * units]
            shapes["bias_hh"] = [gates * units]
        }
        return shapes
    }

    public var parameters: [String: Tensor] { storage }

    public mutating func setParameter(_ suffix: String, to value: Tensor) throws(EngineError) {
        guard let shape = parameterShapes(inputSize: inputSize)[suffix] else { throw rejectParameter(suffix) }
        try checkShape(value, shape, "\(name).\(suffix)")
        storage[suffix] = value
    }

    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        let shape = try singleInput(inputShapes)
        guard shape.count == 2, shape[0] > 0, shape[1] > 0 else {
            throw EngineError(.invalidModel, "\(type) '\(name)' needs a [T, features] input (steps, features), got \(shape)")
        }
        if inputSize != 0 && shape[1] != inputSize {
            throw EngineError(.invalidModel, "\(type) '\(name)' expects \(inputSize) features per step, got \(shape[1])")
        }
        return returnSequences ? [shape[0], units] : [units]
    }

    /// PyTorch's initialisation: every parameter uniform in `±1/√units`.
    public mutating func build(inputShapes: [[Int]], random: inout OrchardRandom) throws(EngineError) {
        _ = try outputShape(for: inputShapes)
        let features = inputShapes[0][1]
        let shapes = parameterShapes(inputSize: features)
        guard storage.keys.sorted() != shapes.keys.sorted() || shapes.contains(where: { storage[$0.key]?.shape != $0.value }) else { return }
        setInputSize(features)
        let limit = 1 / Float(units).squareRoot()
        storage = [:]
        for (suffix, shape) in shapes.sorted(by: { $0.key < $1.key }) {
            let values = (0..<shape.reduce(1, *)).map { _ in random.nextFloat(symmetric: limit) }
            storage[suffix] = Tensor(shape: shape, scalars: values)
        }
    }

    public var spec: LayerSpec {
        var s = baseSpec()
        s.units = units
        s.inputSize = inputSize
        s.useBias = useBias
        s.returnSequences = returnSequences
        if type == .lstm { s.cifg = cell == .cifg }
        return s
    }

    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let input = inputs[0]
        precondition(input.rank == 3 && input.shape[2] == inputSize, "\(type) '\(name)' expects [batch, T, \(inputSize)], got \(input.shape)")
        let (batch, steps) = (input.shape[0], input.shape[1])
        let shape = RecurrentShape(cell: cell, batch: batch, steps: steps, inputSize: inputSize, hidden: units, returnSequences: returnSequences)
        var out = Tensor(shape: returnSequences ? [batch, steps, units] : [batch, units])
        guard batch > 0 else { return out }
        var scratch = [Float](repeating: 0, count: batch * RecurrentShape.scratchPerSample(cell: cell, steps: steps, inputSize: inputSize, hidden: units))
        var step = [Float](repeating: 0, count: batch * RecurrentShape.stepScratchPerSample(cell: cell, steps: steps, inputSize: inputSize, hidden: units))
        // The parameters in one buffer, as the training plan holds them.
        let suffixes = ["weight_ih", "weight_hh"] + (useBias ? ["bias_ih", "bias_hh"] : [])
        var packed: [Float] = []
        var offsets: [Int] = []
        for suffix in suffixes {
            offsets.append(packed.count)
            packed += storage[suffix]?.scalars ?? []
        }
        // Then room for the transposed weights.
        offsets.append(packed.count)
        packed += [Float](repeating: 0, count: RecurrentShape.transposedCount(cell: cell, inputSize: inputSize, hidden: units))
        input.withUnsafeBufferPointer { x in
            out.withUnsafeMutableBufferPointer { y in
                scratch.withUnsafeMutableBufferPointer { s in
                    step.withUnsafeMutableBufferPointer { stepBuffer in
                        packed.withUnsafeMutableBufferPointer { all in
                            let base = all.baseAddress!
                            let parameters = RecurrentParameters(
                                weightIH: base + offsets[0], weightHH: base + offsets[1], transposed: base + offsets.last!,
                                biasIH: useBias ? base + offsets[2] : nil, biasHH: useBias ? base + offsets[3] : nil)
                            Ops.recurrentForward(
                                shape, x: x.baseAddress!, parameters: parameters, scratch: s.baseAddress!, step: stepBuffer.baseAddress!, y: y.baseAddress!)
                        }
                    }
                }
            }
        }
        return out
    }
}

/// Long short-term memory over `[T, inputSize]` (PyTorch's `nn.LSTM`, one layer, batch first, zero initial state);
/// with `cifg`, the coupled input–forget gate variant (f = 1 − i, three gate rows i, g, o: Gboard's keyboard model).
public struct LSTM: RecurrentLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .lstm }
    public let units: Int
    public private(set) var inputSize: Int
    public let returnSequences: Bool
    public let useBias: Bool
    /// Whether the input and forget gates are coupled.
    public let cifg: Bool
    public var storage: [String: Tensor] = [:]
    public var cell: RecurrentCell { cifg ? .cifg : .lstm }

    /// Creates an LSTM of `units` hidden units; `inputSize` is inferred when the model is built if omitted.
    public init(
        units: Int, returnSequences: Bool = false, cifg: Bool = false, useBias: Bool = true, inputSize: Int? = nil, name: String = "",
        inputs: [String] = [], frozen: Bool = false
    ) {
        precondition(units > 0, "an LSTM needs at least one unit")
        (self.units, self.returnSequences, self.cifg, self.useBias, self.inputSize) = (units, returnSequences, cifg, useBias, inputSize ?? 0)
        (self.name, self.inputNames, self.isFrozen) = (name, inputs, frozen)
    }

    public mutating func setInputSize(_ size: Int) { inputSize = size }
}

/// Gated recurrent unit over `[T, inputSize]` (PyTorch's `nn.GRU`, one layer, batch first, zero initial state):
/// `n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))`, `h' = (1 − z) ⊙ n + z ⊙ h`.
public struct GRU: RecurrentLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .gru }
    public let units: Int
    public private(set) var inputSize: Int
    public let returnSequences: Bool
    public let useBias: Bool
    public var storage: [String: Tensor] = [:]
    public var cell: RecurrentCell { .gru }

    /// Creates a GRU of `units` hidden units; `inputSize` is inferred when the model is built if omitted.
    public init(
        units: Int, returnSequences: Bool = false, useBias: Bool = true, inputSize: Int? = nil, name: String = "", inputs: [String] = [],
        frozen: Bool = false
    ) {
        precondition(units > 0, "a GRU needs at least one unit")
        (self.units, self.returnSequences, self.useBias, self.inputSize) = (units, returnSequences, useBias, inputSize ?? 0)
        (self.name, self.inputNames, self.isFrozen) = (name, inputs, frozen)
    }

    public mutating func setInputSize(_ size: Int) { inputSize = size }
}
