public import OrchardSupport
public import OrchardFormats

/// Checks a replacement parameter's shape.
func checkShape(_ value: Tensor, _ expected: [Int], _ what: String) throws(EngineError) {
    guard value.shape == expected else {
        throw EngineError(.shapeMismatch, "\(what) must have shape \(expected), not \(value.shape)")
    }
}

/// He-uniform initial values: uniform in `±√(6 / fanIn)` (He et al. 2015, suited to ReLU networks).
func heUniform(shape: [Int], fanIn: Int, random: inout OrchardRandom) -> Tensor {
    let limit = (6 / Float(max(fanIn, 1))).squareRoot()
    let count = shape.reduce(1, *)
    var values = [Float](repeating: 0, count: count)
    for i in 0..<count { values[i] = random.nextFloat(symmetric: limit) }
    return Tensor(shape: shape, scalars: values)
}

/// Fully connected layer: `y = x · Wᵀ + b`, weight `[units, inputSize]`, bias `[units]`.
///
/// Weights start He-uniform and biases at zero. The input must be rank 1 per sample (use ``Flatten`` first).
public struct Dense: Layer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .dense }
    /// Output width.
    public let units: Int
    /// Input width; 0 until built.
    public private(set) var inputSize: Int
    /// Whether the layer adds a bias.
    public let useBias: Bool
    /// The weight, `[units, inputSize]`.
    public private(set) var weight: Tensor
    /// The bias, `[units]`, when ``useBias``.
    public private(set) var bias: Tensor?

    /// Creates a dense layer; `inputSize` is inferred when the model is built if omitted.
    public init(units: Int, inputSize: Int? = nil, useBias: Bool = true, name: String = "", inputs: [String] = [], frozen: Bool = false) {
        precondition(units > 0, "a dense layer needs at least one unit")
        self.name = name
        self.inputNames = inputs
        self.isFrozen = frozen
        self.units = units
        self.inputSize = inputSize ?? 0
        self.useBias = useBias
        self.weight = Tensor(shape: [units, 0])
        self.bias = useBias ? Tensor(shape: [units]) : nil
    }

    /// Creates a dense layer from explicit parameters.
    public init(weight: Tensor, bias: Tensor?, name: String = "", inputs: [String] = [], frozen: Bool = false) {
        precondition(weight.rank == 2, "dense weight must be [units, inputSize]")
        precondition(bias == nil || bias!.shape == [weight.shape[0]], "dense bias must be [units]")
        self.init(units: weight.shape[0], inputSize: weight.shape[1], useBias: bias != nil, name: name, inputs: inputs, frozen: frozen)
        self.weight = weight
        self.bias = bias
    }

    public var parameters: [String: Tensor] {
        var p = ["weight": weight]
        if let bias { p["bias"] = bias }
        return p
    }

    public mutating func setParameter(_ suffix: String, to value: Tensor) throws(EngineError) {
        switch suffix {
        case "weight": try checkShape(value, [units, inputSize], "\(name).weight"); weight = value
        case "bias" where useBias: try checkShape(value, [units], "\(name).bias"); bias = value
        default: throw rejectParameter(suffix)
        }
    }

    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        let shape = try singleInput(inputShapes)
        guard let width = shape.last else {
            throw EngineError(.invalidModel, "dense layer '\(name)' needs an input of rank 1 or more per sample, got \(shape)")
        }
        if inputSize != 0 && width != inputSize {
            throw EngineError(.invalidModel, "dense layer '\(name)' expects input size \(inputSize), got \(width)")
        }
        // Over the last axis, as PyTorch's `nn.Linear`: `[T, features]` becomes `[T, units]`.
        return shape.dropLast() + [units]
    }

    public mutating func build(inputShapes: [[Int]], random: inout OrchardRandom) throws(EngineError) {
        _ = try outputShape(for: inputShapes)
        if inputSize == 0 || weight.shape != [units, inputSize] {
            inputSize = inputShapes[0].last!
            weight = heUniform(shape: [units, inputSize], fanIn: inputSize, random: &random)
            bias = useBias ? Tensor(shape: [units]) : nil
        }
    }

    public var spec: LayerSpec {
        var s = baseSpec()
        s.units = units
        s.inputSize = inputSize
        s.useBias = useBias
        return s
    }

    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let input = inputs[0]
        precondition(input.shape.last == inputSize, "dense layer '\(name)' expects \(inputSize) features, got \(input.shape)")
        // Every position of every sample is a row.
        let batch = input.count / max(inputSize, 1)
        var out = Tensor(shape: input.shape.dropLast() + [units])
        input.withUnsafeBufferPointer { x in
            weight.withUnsafeBufferPointer { w in
                out.withUnsafeMutableBufferPointer { y in
                    if let bias {
                        bias.withUnsafeBufferPointer { b in
                            Ops.denseForward(
                                batch: batch, inSize: inputSize, outSize: units, x: x.baseAddress!, weight: w.baseAddress!, bias: b.baseAddress!,
                                y: y.baseAddress!)
                        }
                    } else {
                        Ops.denseForward(
                            batch: batch, inSize: inputSize, outSize: units, x: x.baseAddress!, weight: w.baseAddress!, bias: nil, y: y.baseAddress!)
                    }
                }
            }
        }
        return out
    }
}

/// Lookup table: each category index selects a row of the weight `[vocabularySize, embeddingSize]`.
///
/// For a per-sample input of `n` indices the output is the `n` rows laid end to end, shape `[n · embeddingSize]`.
/// Rows start uniform in `±0.05`. Indices must be whole numbers in `0..<vocabularySize`.
public struct Embedding: Layer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .embedding }
    /// Number of categories.
    public let vocabularySize: Int
    /// Width of each row.
    public let embeddingSize: Int
    /// The table, `[vocabularySize, embeddingSize]`.
    public private(set) var weight: Tensor
    private var initialised: Bool

    /// Creates an embedding whose table is initialised when the model is built.
    public init(vocabularySize: Int, embeddingSize: Int, name: String = "", inputs: [String] = [], frozen: Bool = false) {
        precondition(vocabularySize > 0 && embeddingSize > 0, "an embedding needs a positive vocabulary and width")
        self.name = name
        self.inputNames = inputs
        self.isFrozen = frozen
        self.vocabularySize = vocabularySize
        self.embeddingSize = embeddingSize
        self.weight = Tensor(shape: [vocabularySize, embeddingSize])
        self.initialised = false
    }

    /// Creates an embedding from an explicit table `[vocabularySize, embeddingSize]`.
    public init(weight: Tensor, name: String = "", inputs: [String] = [], frozen: Bool = false) {
        precondition(weight.rank == 2, "embedding weight must be [vocabularySize, embeddingSize]")
        self.init(vocabularySize: weight.shape[0], embeddingSize: weight.shape[1], name: name, inputs: inputs, frozen: frozen)
        self.weight = weight
        self.initialised = true
    }

    public var parameters: [String: Tensor] { ["weight": weight] }

    public mutating func setParameter(_ suffix: String, to value: Tensor) throws(EngineError) {
        guard suffix == "weight" else { throw rejectParameter(suffix) }
        try checkShape(value, [vocabularySize, embeddingSize], "\(name).weight")
        weight = value
        initialised = true
    }

    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        let shape = try singleInput(inputShapes)
        guard shape.count == 1 else {
            throw EngineError(.invalidModel, "embedding '\(name)' needs a rank-1 input of indices, got \(shape)")
        }
        return [shape[0] * embeddingSize]
    }

    public mutating func build(inputShapes: [[Int]], random: inout OrchardRandom) throws(EngineError) {
        _ = try outputShape(for: inputShapes)
        guard !initialised else { return }
        var values = [Float](repeating: 0, count: vocabularySize * embeddingSize)
        for i in values.indices { values[i] = random.nextFloat(symmetric: 0.05) }
        weight = Tensor(shape: [vocabularySize, embeddingSize], scalars: values)
        initialised = true
    }

    public var spec: LayerSpec {
        var s = baseSpec()
        s.vocabularySize = vocabularySize
        s.embeddingSize = embeddingSize
        return s
    }

    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let (batch, n) = batchLayout(inputs[0])
        var out = Tensor(shape: [batch, n * embeddingSize])
        inputs[0].withUnsafeBufferPointer { x in
            if let bad = Ops.firstInvalidIndex(count: x.count, indices: x.baseAddress!, vocabulary: vocabularySize) {
                preconditionFailure("embedding '\(name)': index \(bad) is not in 0..<\(vocabularySize)")
            }
            weight.withUnsafeBufferPointer { w in
                out.withUnsafeMutableBufferPointer { y in
                    Ops.embeddingForward(
                        batch: batch, indicesPerSample: n, dim: embeddingSize, indices: x.baseAddress!, table: w.baseAddress!, y: y.baseAddress!)
                }
            }
        }
        return out
    }
}

/// 2-D convolution over `[C, H, W]` samples: weight `[filters, inChannels, kernelH, kernelW]`, bias `[filters]`.
///
/// Runs as im2col followed by one matrix multiply per sample. Weights start He-uniform, biases at zero.
public struct Conv2D: Layer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .conv2d }
    /// Number of output channels.
    public let filters: Int
    /// `[kernelH, kernelW]`.
    public let kernelSize: [Int]
    /// `[strideH, strideW]`.
    public let strides: [Int]
    /// How the input is padded.
    public let padding: Padding
    /// Whether the layer adds a bias.
    public let useBias: Bool
    /// Input channels; 0 until built.
    public private(set) var inChannels: Int
    /// The filters, `[filters, inChannels, kernelH, kernelW]`.
    public private(set) var weight: Tensor
    /// The bias, `[filters]`, when ``useBias``.
    public private(set) var bias: Tensor?

    /// Creates a convolution; `inChannels` is inferred when the model is built if omitted.
    public init(
        filters: Int, kernelSize: [Int], strides: [Int] = [1, 1], padding: Padding = .valid, useBias: Bool = true,
        inChannels: Int? = nil, name: String = "", inputs: [String] = [], frozen: Bool = false
    ) {
        precondition(filters > 0, "a convolution needs at least one filter")
        precondition(kernelSize.count == 2 && kernelSize.allSatisfy { $0 > 0 }, "kernelSize is [height, width] > 0")
        precondition(strides.count == 2 && strides.allSatisfy { $0 > 0 }, "strides is [height, width] > 0")
        self.name = name
        self.inputNames = inputs
        self.isFrozen = frozen
        self.filters = filters
        self.kernelSize = kernelSize
        self.strides = strides
        self.padding = padding
        self.useBias = useBias
        self.inChannels = inChannels ?? 0
        self.weight = Tensor(shape: [filters, 0, kernelSize[0], kernelSize[1]])
        self.bias = useBias ? Tensor(shape: [filters]) : nil
    }

    public var parameters: [String: Tensor] {
        var p = ["weight": weight]
        if let bias { p["bias"] = bias }
        return p
    }

    public mutating func setParameter(_ suffix: String, to value: Tensor) throws(EngineError) {
        switch suffix {
        case "weight": try checkShape(value, [filters, inChannels, kernelSize[0], kernelSize[1]], "\(name).weight"); weight = value
        case "bias" where useBias: try checkShape(value, [filters], "\(name).bias"); bias = value
        default: throw rejectParameter(suffix)
        }
    }

    func geometry(_ shape: [Int]) -> WindowGeometry {
        WindowGeometry(channels: shape[0], height: shape[1], width: shape[2], kernel: kernelSize, strides: strides, padding: padding)
    }

    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        let shape = try singleInput(inputShapes)
        guard shape.count == 3 else {
            throw EngineError(.invalidModel, "conv2d '\(name)' needs a [C, H, W] input, got \(shape)")
        }
        if inChannels != 0 && shape[0] != inChannels {
            throw EngineError(.invalidModel, "conv2d '\(name)' expects \(inChannels) input channels, got \(shape[0])")
        }
        let g = geometry(shape)
        guard g.outH > 0 && g.outW > 0 else {
            throw EngineError(.invalidModel, "conv2d '\(name)': kernel \(kernelSize) does not fit input \(shape) with padding \(padding)")
        }
        return [filters, g.outH, g.outW]
    }

    public mutating func build(inputShapes: [[Int]], random: inout OrchardRandom) throws(EngineError) {
        _ = try outputShape(for: inputShapes)
        let c = inputShapes[0][0]
        let shape = [filters, c, kernelSize[0], kernelSize[1]]
        if weight.shape != shape {
            inChannels = c
            weight = heUniform(shape: shape, fanIn: c * kernelSize[0] * kernelSize[1], random: &random)
            bias = useBias ? Tensor(shape: [filters]) : nil
        }
    }

    public var spec: LayerSpec {
        var s = baseSpec()
        s.units = filters
        s.kernelSize = kernelSize
        s.strides = strides
        s.padding = padding
        s.inChannels = inChannels
        s.useBias = useBias
        return s
    }

    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let input = inputs[0]
        precondition(input.rank == 4 && input.shape[1] == inChannels, "conv2d '\(name)' expects [batch, \(inChannels), H, W], got \(input.shape)")
        let g = geometry(Array(input.shape.dropFirst()))
        let batch = input.shape[0]
        var out = Tensor(shape: [batch, filters, g.outH, g.outW])
        var col = [Float](repeating: 0, count: g.patchSize * g.outputPlane)
        input.withUnsafeBufferPointer { x in
            weight.withUnsafeBufferPointer { w in
                out.withUnsafeMutableBufferPointer { y in
                    col.withUnsafeMutableBufferPointer { colBuffer in
                        let biasCopy = bias?.scalars ?? []
                        biasCopy.withUnsafeBufferPointer { b in
                            Ops.convForward(
                                g, filters: filters, batch: batch, x: x.baseAddress!, weight: w.baseAddress!,
                                bias: useBias ? b.baseAddress : nil, y: y.baseAddress!, col: colBuffer.baseAddress!
                            )
                        }
                    }
                }
            }
        }
        return out
    }
}
