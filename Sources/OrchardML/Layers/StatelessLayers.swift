public import OrchardSupport
public import OrchardFormats

/// A layer without parameters: building only checks the input shapes.
public protocol ParameterFreeLayer: Layer {}

extension ParameterFreeLayer {
    public var parameters: [String: Tensor] { [:] }
    public mutating func setParameter(_ suffix: String, to value: Tensor) throws(EngineError) { throw rejectParameter(suffix) }
    public mutating func build(inputShapes: [[Int]], random: inout OrchardRandom) throws(EngineError) {
        _ = try outputShape(for: inputShapes)
    }
    public var spec: LayerSpec { baseSpec() }
}

/// A layer without parameters whose output has its input's shape.
public protocol ShapePreservingLayer: ParameterFreeLayer {}

extension ShapePreservingLayer {
    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] { try singleInput(inputShapes) }
}

/// `max(0, x)`.
public struct ReLU: ShapePreservingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .relu }
    /// Creates the activation.
    public init(name: String = "", inputs: [String] = []) {
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor { elementwise(inputs[0], { Ops.reluForward(count: $0, x: $1, y: $2) }) }
}

/// `1 / (1 + e^-x)`.
public struct Sigmoid: ShapePreservingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .sigmoid }
    /// Creates the activation.
    public init(name: String = "", inputs: [String] = []) {
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor { elementwise(inputs[0], { Ops.sigmoidForward(count: $0, x: $1, y: $2) }) }
}

/// Hyperbolic tangent.
public struct Tanh: ShapePreservingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .tanh }
    /// Creates the activation.
    public init(name: String = "", inputs: [String] = []) {
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor { elementwise(inputs[0], { Ops.tanhForward(count: $0, x: $1, y: $2) }) }
}

/// Softmax over the last axis. With the cross-entropy loss the trainer fuses it into the loss.
public struct Softmax: ShapePreservingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .softmax }
    /// Creates the activation.
    public init(name: String = "", inputs: [String] = []) {
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let width = inputs[0].shape.last ?? 1
        return elementwise(inputs[0], { count, x, y in Ops.softmaxForward(rows: count / width, width: width, x: x, y: y) })
    }
}

/// Inverted dropout: in training, zeroes each unit with probability ``rate`` and scales survivors by
/// `1 / (1 − rate)`; at inference it passes its input through.
public struct Dropout: ShapePreservingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .dropout }
    /// The probability of zeroing a unit, in `[0, 1)`.
    public let rate: Float
    /// Creates a dropout layer.
    public init(rate: Float, name: String = "", inputs: [String] = []) {
        precondition(rate >= 0 && rate < 1, "dropout rate must be in [0, 1)")
        self.rate = rate
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public var spec: LayerSpec {
        var s = baseSpec()
        s.rate = Double(rate)
        return s
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor { inputs[0] }
}

/// Reshapes each sample to one dimension.
public struct Flatten: ParameterFreeLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .flatten }
    /// Creates the layer.
    public init(name: String = "", inputs: [String] = []) {
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        [try singleInput(inputShapes).reduce(1, *)]
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let (batch, width) = batchLayout(inputs[0])
        return inputs[0].reshaped([batch, width])
    }
}

/// Gives each sample another shape with the same values in the same order (an embedding's `[T × E]` as `[T, E]`, for
/// a recurrent layer).
public struct Reshape: ParameterFreeLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .reshape }
    /// The per-sample output shape.
    public let targetShape: [Int]
    /// Creates the layer.
    public init(_ targetShape: [Int], name: String = "", inputs: [String] = []) {
        precondition(!targetShape.isEmpty && targetShape.allSatisfy { $0 > 0 }, "a reshape needs one or more positive sizes")
        self.targetShape = targetShape
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        let shape = try singleInput(inputShapes)
        guard shape.reduce(1, *) == targetShape.reduce(1, *) else {
            throw EngineError(.invalidModel, "reshape '\(name)': \(targetShape) does not hold the values of input \(shape)")
        }
        return targetShape
    }
    public var spec: LayerSpec {
        var s = baseSpec()
        s.targetShape = targetShape
        return s
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor { inputs[0].reshaped([inputs[0].shape.first ?? 0] + targetShape) }
}

/// Joins several inputs along the last (feature) axis; all other per-sample dimensions must agree.
public struct Concat: ParameterFreeLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .concat }
    /// Creates the layer reading `inputs` (names of model inputs or earlier layers).
    public init(name: String = "", inputs: [String] = []) {
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        guard let first = inputShapes.first, !first.isEmpty else {
            throw EngineError(.invalidModel, "concat '\(name)' needs inputs of rank 1 or more")
        }
        let leading = first.dropLast()
        guard inputShapes.allSatisfy({ $0.count == first.count && $0.dropLast() == leading }) else {
            throw EngineError(.invalidModel, "concat '\(name)' inputs differ in their leading dimensions: \(inputShapes)")
        }
        return Array(leading) + [inputShapes.map { $0.last! }.reduce(0, +)]
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let widths = inputs.map { $0.shape.last! }
        let outer = inputs[0].count / widths[0]
        var outShape = inputs[0].shape
        outShape[outShape.count - 1] = widths.reduce(0, +)
        var values: [Float] = []
        values.reserveCapacity(outShape.reduce(1, *))
        for r in 0..<outer {
            for (t, w) in zip(inputs, widths) { values.append(contentsOf: t.scalars[(r * w)..<((r + 1) * w)]) }
        }
        return Tensor(shape: outShape, scalars: values)
    }
}

/// A 2-D pooling layer over `[C, H, W]` samples: its window geometry, output shape and spec.
public protocol WindowPoolingLayer: ParameterFreeLayer {
    /// `[poolH, poolW]`.
    var poolSize: [Int] { get }
    /// `[strideH, strideW]`.
    var strides: [Int] { get }
    /// How the input is padded.
    var padding: Padding { get }
}

extension WindowPoolingLayer {
    func geometry(_ shape: [Int]) -> WindowGeometry {
        WindowGeometry(channels: shape[0], height: shape[1], width: shape[2], kernel: poolSize, strides: strides, padding: padding)
    }

    public func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int] {
        let shape = try singleInput(inputShapes)
        guard shape.count == 3 else {
            throw EngineError(.invalidModel, "\(type) '\(name)' needs a [C, H, W] input, got \(shape)")
        }
        let g = geometry(shape)
        guard g.outH > 0 && g.outW > 0 else {
            throw EngineError(.invalidModel, "\(type) '\(name)': pool \(poolSize) does not fit input \(shape)")
        }
        return [shape[0], g.outH, g.outW]
    }

    public var spec: LayerSpec {
        var s = baseSpec()
        s.kernelSize = poolSize
        s.strides = strides
        s.padding = padding
        return s
    }
}

/// 2-D max pooling over `[C, H, W]` samples.
public struct MaxPool2D: WindowPoolingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .maxPool2d }
    /// `[poolH, poolW]`.
    public let poolSize: [Int]
    /// `[strideH, strideW]`; defaults to the pool size.
    public let strides: [Int]
    /// How the input is padded (padded positions never win).
    public let padding: Padding
    /// Creates the layer.
    public init(poolSize: [Int] = [2, 2], strides: [Int]? = nil, padding: Padding = .valid, name: String = "", inputs: [String] = []) {
        precondition(poolSize.count == 2 && poolSize.allSatisfy { $0 > 0 }, "poolSize is [height, width] > 0")
        self.poolSize = poolSize
        self.strides = strides ?? poolSize
        precondition(self.strides.count == 2 && self.strides.allSatisfy { $0 > 0 }, "strides is [height, width] > 0")
        self.padding = padding
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let input = inputs[0]
        precondition(input.rank == 4, "maxPool2d '\(name)' expects [batch, C, H, W], got \(input.shape)")
        let g = geometry(Array(input.shape.dropFirst()))
        let batch = input.shape[0]
        var out = Tensor(shape: [batch, g.channels, g.outH, g.outW])
        var argmax = [Float](repeating: 0, count: out.count)
        input.withUnsafeBufferPointer { x in
            out.withUnsafeMutableBufferPointer { y in
                argmax.withUnsafeMutableBufferPointer { a in
                    Ops.maxPoolForward(g, batch: batch, x: x.baseAddress!, y: y.baseAddress!, argmax: a.baseAddress!)
                }
            }
        }
        return out
    }
}

/// 2-D average pooling over `[C, H, W]`: each output is the mean of its window's positions inside the image (padded
/// positions are left out of the count, as TensorFlow's and Core ML's `avgPoolExcludePadding` do).
public struct AvgPool2D: WindowPoolingLayer {
    public var name: String
    public var inputNames: [String]
    public var isFrozen: Bool
    public var type: LayerType { .avgPool2d }
    /// `[poolH, poolW]`.
    public let poolSize: [Int]
    /// `[strideH, strideW]`; defaults to the pool size.
    public let strides: [Int]
    /// How the input is padded (padded positions are not averaged).
    public let padding: Padding
    /// Creates the layer.
    public init(poolSize: [Int] = [2, 2], strides: [Int]? = nil, padding: Padding = .valid, name: String = "", inputs: [String] = []) {
        precondition(poolSize.count == 2 && poolSize.allSatisfy { $0 > 0 }, "poolSize is [height, width] > 0")
        self.poolSize = poolSize
        self.strides = strides ?? poolSize
        precondition(self.strides.count == 2 && self.strides.allSatisfy { $0 > 0 }, "strides is [height, width] > 0")
        self.padding = padding
        self.name = name
        self.inputNames = inputs
        self.isFrozen = false
    }
    public func callAsFunction(_ inputs: [Tensor]) -> Tensor {
        let input = inputs[0]
        precondition(input.rank == 4, "avgPool2d '\(name)' expects [batch, C, H, W], got \(input.shape)")
        let g = geometry(Array(input.shape.dropFirst()))
        let batch = input.shape[0]
        var out = Tensor(shape: [batch, g.channels, g.outH, g.outW])
        input.withUnsafeBufferPointer { x in
            out.withUnsafeMutableBufferPointer { y in Ops.avgPoolForward(g, batch: batch, x: x.baseAddress!, y: y.baseAddress!) }
        }
        return out
    }
}
