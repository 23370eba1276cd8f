public import OrchardSupport
public import OrchardFormats

/// A model layer: a value describing one step of a model, with its parameters, callable for inference.
///
/// Shapes a layer talks about are per sample (no batch dimension); tensors passed to ``callAsFunction(_:)`` carry
/// the batch as their first dimension. Training does not call layers one by one: ``CompiledModel`` compiles a
/// model into preallocated buffers and runs the same pointer kernels.
public protocol Layer: Sendable {
    /// The layer's unique name; empty until a model assigns one.
    var name: String { get set }
    /// Names of the inputs or earlier layers this layer reads; empty means "the previous layer".
    var inputNames: [String] { get set }
    /// A frozen layer is not updated and skips gradient work it does not need.
    var isFrozen: Bool { get set }
    /// The layer's kind in the architecture JSON.
    var type: LayerType { get }
    /// The parameters by suffix (`weight`, `bias`); empty for layers without parameters.
    var parameters: [String: Tensor] { get }
    /// Replaces a parameter, checking its shape.
    mutating func setParameter(_ suffix: String, to value: Tensor) throws(EngineError)
    /// The per-sample output shape for the given per-sample input shapes, or an error when they do not fit.
    func outputShape(for inputShapes: [[Int]]) throws(EngineError) -> [Int]
    /// Fixes sizes inferred from the input shapes and initialises missing parameters from `random`.
    mutating func build(inputShapes: [[Int]], random: inout OrchardRandom) throws(EngineError)
    /// The layer as an architecture JSON entry.
    var spec: LayerSpec { get }
    /// Runs the layer in inference mode on batch-first tensors (several only for ``Concat``).
    func callAsFunction(_ inputs: [Tensor]) -> Tensor
}

extension Layer {
    /// Runs a single-input layer on a batch-first tensor.
    public func callAsFunction(_ input: Tensor) -> Tensor { self([input]) }

    /// The same layer with another name.
    public func named(_ name: String) -> Self {
        var copy = self
        copy.name = name
        return copy
    }

    /// The same layer reading the given inputs or layers instead of the previous layer.
    public func reading(_ inputs: String...) -> Self { reading(inputs) }

    /// The same layer reading the given inputs or layers instead of the previous layer.
    public func reading(_ inputs: [String]) -> Self {
        var copy = self
        copy.inputNames = inputs
        return copy
    }

    /// The same layer, frozen (or unfrozen).
    public func frozen(_ frozen: Bool = true) -> Self {
        var copy = self
        copy.isFrozen = frozen
        return copy
    }

    /// Layers without parameters have none to set.
    func rejectParameter(_ suffix: String) -> EngineError {
        EngineError(.invalidArgument, "layer '\(name)' (\(type)) has no parameter '\(suffix)'")
    }

    /// The base of a spec entry: name, type, inputs, frozen flag.
    func baseSpec() -> LayerSpec {
        LayerSpec(name: name, type: type, inputs: inputNames, frozen: isFrozen)
    }

    /// Checks that exactly one input shape was given, returning it.
    func singleInput(_ shapes: [[Int]]) throws(EngineError) -> [Int] {
        guard shapes.count == 1 else {
            throw EngineError(.invalidModel, "layer '\(name)' (\(type)) takes one input, not \(shapes.count)")
        }
        return shapes[0]
    }
}

/// Builds an ordered list of layers: the model DSL.
@resultBuilder
public enum LayerBuilder {
    /// One layer.
    public static func buildExpression(_ layer: some Layer) -> [any Layer] { [layer] }
    /// A list of layers.
    public static func buildExpression(_ layers: [any Layer]) -> [any Layer] { layers }
    /// Consecutive groups.
    public static func buildBlock(_ parts: [any Layer]...) -> [any Layer] { parts.flatMap { $0 } }
    /// An `if` without `else`.
    public static func buildOptional(_ part: [any Layer]?) -> [any Layer] { part ?? [] }
    /// The first branch of an `if`/`else`.
    public static func buildEither(first: [any Layer]) -> [any Layer] { first }
    /// The second branch of an `if`/`else`.
    public static func buildEither(second: [any Layer]) -> [any Layer] { second }
    /// A `for` loop.
    public static func buildArray(_ parts: [[any Layer]]) -> [any Layer] { parts.flatMap { $0 } }
}

/// Runs `body` over a batch-first input's per-sample layout: returns batch size and per-sample element count.
func batchLayout(_ tensor: Tensor) -> (batch: Int, perSample: Int) {
    precondition(tensor.rank >= 1, "layer input needs a batch dimension, got shape \(tensor.shape)")
    let batch = tensor.shape[0]
    return (batch, batch == 0 ? 0 : tensor.count / batch)
}

/// Applies an element-wise kernel to a tensor, returning a tensor of the same shape.
func elementwise(_ input: Tensor, _ kernel: (Int, UnsafePointer<Float>, UnsafeMutablePointer<Float>) -> Void) -> Tensor {
    var out = Tensor(shape: input.shape)
    input.withUnsafeBufferPointer { x in
        out.withUnsafeMutableBufferPointer { y in kernel(input.count, x.baseAddress!, y.baseAddress!) }
    }
    return out
}
