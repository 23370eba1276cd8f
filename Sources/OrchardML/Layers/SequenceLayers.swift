public import OrchardFormats
public import OrchardSupport

// Layers over sequences `[C, L]` (channels first, as PyTorch's 1-D layers): 1-D convolution and pooling for sensor time
// series. Each is the 2-D layer's computation on a `[C, 1, L]` view with a `[1, k]` window — the memory layouts agree,
// so a `[filters, inChannels, kernel]` weight is the `[filters, inChannels, 1, kernel]` one.

/// The window of a 1-D layer over a `[C, L]` sample, as the 2-D kernels see it.
func sequenceGeometry(_ shape: [Int], kernel: Int, stride: Int, padding: Padding) -> WindowGeometry {
    WindowGeometry(channels: shape[0], height: 1, width: shape[1], kernel: [1, kernel], strides: [1, stride], padding: padding)
}

/// Checks a 1-D layer's `[C, L]` input and window, returning the output length.
func sequenceOutputLength(_ layer: some Layer, _ shape: [Int], kernel: Int, stride: Int, padding: Padding) throws(EngineError) -> Int {
    guard shape.count == 2 else {
        throw EngineError(.invalidModel, "\(layer.type) '\(layer.name)' needs a [C, L] input (channels, steps), got \(shape)")
    }
    let g = sequenceGeometry(shape, kernel: kernel, stride: stride, padding: padding)
    guard g.outW > 0 else {
        throw EngineError(.invalidModel, "\(layer.type) '\(layer.name)': kernel \(kernel) does not fit input \(shape) with padding \(padding)")
    }
    return g.outW
}

/// 1-D convolution over `[C, L]`: weight `[filters, inChannels, kernel]`, bias `[filters]` (PyTorch's `nn.Conv1d`).
public struct Conv1D: Layer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .conv1d }
    /// Output channels.
    public let filters: Int
    /// The window's length.
    public let kernelSize: Int
    /// The step between windows.
    public let stride: Int
    /// How the sequence is padded: `valid` or `same`.
    public let padding: Padding
    /// Whether the layer adds a bias.
    public let useBias: Bool
    /// Input channels; 0 until built.
    public private(set) var inChannels: Int
    /// The filters, `[filters, inChannels, kernel]`.
    public private(set) var weight: Tensor
    /// The bias, `[filters]`, when ``useBias``.
    public private(set) var bias: Tensor?

    /// Creates a 1-D convolution; `inChannels` is inferred when the model is built if omitted.
    public init(
        filters: Int, kernelSize: Int, stride: Int = 1, padding: Padding = .valid, useBias: Bool = true, inChannels: Int? = nil, name: String = "",
        inputs: [String] = [], frozen: Bool = false
    ) {
        precondition(filters > 0 && kernelSize > 0 && stride > 0, "a 1-D convolution needs positive filters, kernel size and stride")
        precondition(padding == .valid || padding == .same, "a 1-D convolution pads valid or same")
        self.name = name
        self.inputNames = inputs
        self.isFrozen = frozen
        self.filters = filters
        self.kernelSize = kernelSize
        self.stride = stride
        self.padding = padding
        self.useBias = useBias
        self.inChannels = inChannels ?? 0
        self.weight = Tensor(shape: [filters, 0, kernelSize])
        self.bias = useBias ? Tensor(shape: [filters]) : nil
    }

    public var parameters: [String: Tensor] {
        var p = ["weight": weight]
        if let bias { p["bias"] = bias }
        return p
    }

    public mutating func setParameter(_ suffix: String, to value: Tensor) throws(EngineError) {
        switch suffix {
        case "weight": try checkShape(value, [filters, inChannels, kernelSize], "\(name).weight"); weight = value
        case "bias" where useBias: try checkShape(value, [filters], "\(name).bias"); bias = value
        default: throw rejectParameter(suffix)
        }
    }

    func geometry(_ shape: [Int]) -> WindowGeometry { sequenceGeometry(shape, kernel: kernelSize, stride: stride, padding: padding) }

    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        let shape = try singleInput(inputShapes)
        let length = try sequenceOutputLength(self, shape, kernel: kernelSize, stride: stride, padding: padding)
        if inChannels != 0 && shape[0] != inChannels {
            throw EngineError(.invalidModel, "conv1d '\(name)' expects \(inChannels) input channels, got \(shape[0])")
        }
        return [filters, length]
    }

    public mutating func build(inputShapes: [[Int]], random: inout OrchardRandom) throws(EngineError) {
        _ = try outputShape(for: inputShapes)
        let c = inputShapes[0][0]
        let shape = [filters, c, kernelSize]
        if weight.shape != shape {
            inChannels = c
            weight = heUniform(shape: shape, fanIn: c * kernelSize, random: &random)
            bias = useBias ? Tensor(shape: [filters]) : nil
        }
    }

    public var spec: LayerSpec {
        var s = baseSpec()
        s.units = filters
        s.kernelSize = [kernelSize]
        s.strides = [stride]
        s.padding = padding
        s.inChannels = inChannels
        s.useBias = useBias
        return s
    }

    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let input = inputs[0]
        precondition(input.rank == 3 && input.shape[1] == inChannels, "conv1d '\(name)' expects [batch, \(inChannels), L], got \(input.shape)")
        let g = geometry(Array(input.shape.dropFirst()))
        let batch = input.shape[0]
        var out = Tensor(shape: [batch, filters, g.outW])
        var col = [Float](repeating: 0, count: g.patchSize * g.outputPlane)
        let biasCopy = bias?.scalars ?? []
        input.withUnsafeBufferPointer { x in
            weight.withUnsafeBufferPointer { w in
                out.withUnsafeMutableBufferPointer { y in
                    col.withUnsafeMutableBufferPointer { colBuffer in
                        biasCopy.withUnsafeBufferPointer { b in
                            Ops.convForward(
                                g, filters: filters, batch: batch, x: x.baseAddress!, weight: w.baseAddress!, bias: useBias ? b.baseAddress : nil,
                                y: y.baseAddress!, col: colBuffer.baseAddress!)
                        }
                    }
                }
            }
        }
        return out
    }
}

/// A 1-D pooling layer over `[C, L]`.
public protocol SequencePoolingLayer: ParameterFreeLayer {
    /// The window's length.
    var poolSize: Int { get }
    /// The step between windows; the pool size by default.
    var stride: Int { get }
    /// How the sequence is padded: `valid` or `same`.
    var padding: Padding { get }
}

extension SequencePoolingLayer {
    func geometry(_ shape: [Int]) -> WindowGeometry { sequenceGeometry(shape, kernel: poolSize, stride: stride, padding: padding) }

    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        let shape = try singleInput(inputShapes)
        return [shape.first ?? 0, try sequenceOutputLength(self, shape, kernel: poolSize, stride: stride, padding: padding)]
    }

    public var spec: LayerSpec {
        var s = baseSpec()
        s.kernelSize = [poolSize]
        s.strides = [stride]
        s.padding = padding
        return s
    }

    /// A checked window: a positive size and stride (the size by default), `valid` or `same` padding.
    static func window(_ poolSize: Int, _ stride: Int?, _ padding: Padding) -> (Int, Int, Padding) {
        precondition(poolSize > 0 && (stride ?? 1) > 0, "a 1-D pool needs a positive size and stride")
        precondition(padding == .valid || padding == .same, "a 1-D pool pads valid or same")
        return (poolSize, stride ?? poolSize, padding)
    }

    /// The pooled batch `[batch, C, L']` of `input` `[batch, C, L]`.
    func pooled(_ input: Tensor, _ kernel: (WindowGeometry, Int, UnsafePointer<Float>, UnsafeMutablePointer<Float>) -> Void) -> Tensor {
        precondition(input.rank == 3, "\(type) '\(name)' expects [batch, C, L], got \(input.shape)")
        let g = geometry(Array(input.shape.dropFirst()))
        let batch = input.shape[0]
        var out = Tensor(shape: [batch, g.channels, g.outW])
        input.withUnsafeBufferPointer { x in
            out.withUnsafeMutableBufferPointer { y in kernel(g, batch, x.baseAddress!, y.baseAddress!) }
        }
        return out
    }
}

/// 1-D max pooling over `[C, L]` (padded positions never win).
public struct MaxPool1D: SequencePoolingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .maxPool1d }
    public let poolSize: Int
    public let stride: Int
    public let padding: Padding

    /// Creates the layer.
    public init(poolSize: Int = 2, stride: Int? = nil, padding: Padding = .valid, name: String = "", inputs: [String] = []) {
        (self.poolSize, self.stride, self.padding) = Self.window(poolSize, stride, padding)
        (self.name, self.inputNames, self.isFrozen) = (name, inputs, false)
    }

    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        pooled(inputs[0]) { g, batch, x, y in
            var argmax = [Float](repeating: 0, count: batch * g.channels * g.outputPlane)
            argmax.withUnsafeMutableBufferPointer { a in Ops.maxPoolForward(g, batch: batch, x: x, y: y, argmax: a.baseAddress!) }
        }
    }
}

/// 1-D average pooling over `[C, L]`: each output is the mean of its window's positions inside the sequence (padded
/// positions are left out of the count).
public struct AvgPool1D: SequencePoolingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .avgPool1d }
    public let poolSize: Int
    public let stride: Int
    public let padding: Padding

    /// Creates the layer.
    public init(poolSize: Int = 2, stride: Int? = nil, padding: Padding = .valid, name: String = "", inputs: [String] = []) {
        (self.poolSize, self.stride, self.padding) = Self.window(poolSize, stride, padding)
        (self.name, self.inputNames, self.isFrozen) = (name, inputs, false)
    }

    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        pooled(inputs[0]) { g, batch, x, y in Ops.avgPoolForward(g, batch: batch, x: x, y: y) }
    }
}
