public import Foundation

/// A model's architecture, as JSON a server can ship and any Orchard component can rebuild.
///
/// Conventions every component follows:
/// - Per-sample shapes exclude the batch dimension. Images are channels-first: `[C, H, W]`.
/// - Parameters are named `<layer>.weight` and `<layer>.bias`.
/// - `dense`: weight `[units, inputSize]`, bias `[units]` (PyTorch and Core ML's inner-product layout).
/// - `embedding`: weight `[vocabularySize, embeddingSize]`; its input holds category indices stored as Float.
/// - `conv2d`: weight `[filters, inChannels, kernelH, kernelW]`, bias `[filters]`.
/// - `conv1d`: over sequences `[C, L]` (channels first, as PyTorch's `nn.Conv1d`), weight `[filters, inChannels, kernel]`,
///   bias `[filters]` — a PyTorch `Conv1d` state dict's `weight` and `bias` as they are.
/// - `lstm` and `gru`: over batch-first sequences `[T, features]`, output `[T, units]` with `return_sequences`, `[units]`
///   without; parameters `weight_ih` `[gates × units, features]`, `weight_hh` `[gates × units, units]`, `bias_ih` and
///   `bias_hh` `[gates × units]` — a one-layer PyTorch `nn.LSTM`/`nn.GRU` state dict's `*_l0` tensors as they are, gates
///   in PyTorch's order (LSTM i, f, g, o: 4; with `cifg`, i, g, o: 3; GRU r, z, n: 3).
/// - `dense` applies to the last axis, as PyTorch's `nn.Linear`: `[T, features]` becomes `[T, units]`.
/// - A classifier ends with a `softmax` layer (over the last axis; a sequence model's `[T, classes]` output takes `[T]`
///   class-index targets, −1 marking padding); with the `crossEntropy` loss the engine fuses the two (stable),
///   and the targets are class indices stored as Float, shape `[1]`.
///
/// JSON keys are snake_case (`format_version`, `input_size`, `learning_rate`, …) since format version 2; version
/// 1 files, whose keys were camelCase (`formatVersion`, `inputSize`, …), are still read and come back as version 2.
public struct ModelSpec: Sendable, Hashable, Codable {
    /// The version of this JSON layout: 2 (snake_case keys).
    public static let currentFormatVersion = 2
    /// The oldest layout still read: 1 (camelCase keys).
    public static let oldestReadableFormatVersion = 1

    /// The version of the JSON layout this spec was written with.
    public var formatVersion: Int
    /// A display name for the model.
    public var name: String
    /// The model's named inputs.
    public var inputs: [InputSpec]
    /// The layers, each after every layer it reads from.
    public var layers: [LayerSpec]
    /// The name of the layer whose output is the model's output.
    public var output: String
    /// How the model is trained, when the spec carries it.
    public var training: TrainingSpec?

    /// Creates a spec; call ``validate()`` to check it.
    public init(name: String, inputs: [InputSpec], layers: [LayerSpec], output: String? = nil, training: TrainingSpec? = nil) {
        self.formatVersion = Self.currentFormatVersion
        self.name = name
        self.inputs = inputs
        self.layers = layers
        self.output = output ?? layers.last?.name ?? ""
        self.training = training
    }

    /// Encodes the spec as stable, pretty-printed JSON with sorted keys.
    public func jsonData() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(self)
    }

    /// Decodes and validates a spec from JSON: its structure, the size limits and its layers' shapes.
    ///
    /// A syntax error is named by its line and column (`model JSON: line 3, column 11: expected a value, found
    /// 'small' (strings take double quotes)`); other errors by the key or layer at fault.
    public static func decode(json: Data) throws(FormatError) -> ModelSpec {
        let spec: ModelSpec
        do {
            spec = try JSONDecoder().decode(ModelSpec.self, from: json)
        } catch let error as DecodingError {
            if case .dataCorrupted(let context) = error, context.codingPath.isEmpty, let syntax = JSONSyntaxError.find(in: json) {
                throw FormatError(.invalidSpec, "model JSON: \(syntax)")
            }
            throw FormatError(.invalidSpec, "model JSON: \(describe(error))")
        } catch {
            throw FormatError(.invalidSpec, "model JSON: \(error)")
        }
        // The structure, the size limits and the shapes: a model read from a file is built by layers that multiply
        // its sizes, so they are bounded here.
        _ = try spec.layerShapes()
        return spec
    }

    /// Checks structural rules: known format version, unique names, inputs defined before use, a defined output.
    public func validate() throws(FormatError) {
        guard formatVersion == Self.currentFormatVersion else {
            throw FormatError(
                .invalidSpec,
                "model format version \(formatVersion) is not supported (this reader writes \(Self.currentFormatVersion) and reads \(Self.oldestReadableFormatVersion)...\(Self.currentFormatVersion))"
            )
        }
        var known = Set<String>()
        for input in inputs {
            guard !input.name.isEmpty, known.insert(input.name).inserted else {
                throw FormatError(.invalidSpec, "input name '\(input.name)' is empty or repeated")
            }
            guard !input.shape.isEmpty, input.shape.allSatisfy({ $0 > 0 }) else {
                throw FormatError(.invalidSpec, "input '\(input.name)' has invalid shape \(input.shape)")
            }
        }
        guard !layers.isEmpty else { throw FormatError(.invalidSpec, "model '\(name)' has no layers") }
        for layer in layers {
            guard !layer.name.isEmpty, !layer.name.contains("."), known.insert(layer.name).inserted else {
                throw FormatError(.invalidSpec, "layer name '\(layer.name)' is empty, contains '.', or is repeated")
            }
            guard !layer.inputs.isEmpty else {
                throw FormatError(.invalidSpec, "layer '\(layer.name)' reads no input")
            }
            for source in layer.inputs where !known.contains(source) || source == layer.name {
                throw FormatError(.invalidSpec, "layer '\(layer.name)' reads '\(source)', which is not an earlier layer or an input")
            }
            guard LayerType.known.contains(layer.type) else {
                let known = LayerType.known.map(\.rawValue).sorted().joined(separator: ", ")
                throw FormatError(.invalidSpec, "layer '\(layer.name)' has unknown type '\(layer.type)' (known: \(known))")
            }
            if layer.type != .concat && layer.inputs.count != 1 {
                throw FormatError(.invalidSpec, "layer '\(layer.name)' of type \(layer.type) takes exactly one input, not \(layer.inputs.count)")
            }
        }
        guard layers.contains(where: { $0.name == output }) else {
            throw FormatError(.invalidSpec, "output '\(output)' is not a layer")
        }
    }

    /// Decodes a spec, refusing keys it does not know (a misspelt attribute would otherwise be ignored).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: SpecKey.self)
        try c.rejectUnknown(["format_version", "name", "inputs", "layers", "output", "training"], in: "model")
        let snake = try c.decodeIfPresent(Int.self, forKey: SpecKey("format_version"))
        let camel = try c.decodeIfPresent(Int.self, forKey: SpecKey("formatVersion"))
        guard let version = snake ?? camel else {
            throw DecodingError.keyNotFound(
                SpecKey("format_version"), .init(codingPath: decoder.codingPath, debugDescription: "the model JSON has no format_version"))
        }
        // Version 1 spelled its keys in camelCase, version 2 in snake_case; a version in the other spelling is refused.
        let expected = camel != nil && snake == nil ? Self.oldestReadableFormatVersion : Self.currentFormatVersion
        guard version == expected, (Self.oldestReadableFormatVersion...Self.currentFormatVersion).contains(version) else {
            throw DecodingError.dataCorrupted(
                .init(
                    codingPath: decoder.codingPath + [SpecKey(snake != nil ? "format_version" : "formatVersion")],
                    debugDescription:
                        "model format version \(version) is not supported (this reader reads version \(Self.currentFormatVersion) with snake_case keys and version \(Self.oldestReadableFormatVersion) with camelCase keys)"
                ))
        }
        formatVersion = Self.currentFormatVersion
        name = try c.required(String.self, "name")
        inputs = try c.required([InputSpec].self, "inputs")
        layers = try c.required([LayerSpec].self, "layers")
        output = try c.required(String.self, "output")
        training = try c.optional(TrainingSpec.self, "training")
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: SpecKey.self)
        try c.encode(formatVersion, forKey: SpecKey("format_version"))
        try c.encode(name, forKey: SpecKey("name"))
        try c.encode(inputs, forKey: SpecKey("inputs"))
        try c.encode(layers, forKey: SpecKey("layers"))
        try c.encode(output, forKey: SpecKey("output"))
        try c.encodeIfPresent(training, forKey: SpecKey("training"))
    }

    private static func describe(_ error: DecodingError) -> String {
        func path(_ context: DecodingError.Context) -> String {
            let p = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
            return p.isEmpty ? "" : " at \(p)"
        }
        switch error {
        case .keyNotFound(let key, let context): return "missing key '\(key.stringValue)'\(path(context))"
        case .typeMismatch(_, let context): return "\(context.debugDescription)\(path(context))"
        case .valueNotFound(_, let context): return "missing value\(path(context))"
        case .dataCorrupted(let context): return "\(context.debugDescription)\(path(context))"
        @unknown default: return "\(error)"
        }
    }
}

/// One named model input.
public struct InputSpec: Sendable, Hashable, Codable {
    /// The input's name, used by datasets to route features.
    public var name: String
    /// The per-sample shape.
    public var shape: [Int]
    /// Whether the input holds category indices (fed to an embedding) rather than real values.
    public var categorical: Bool

    /// Creates an input.
    public init(name: String, shape: [Int], categorical: Bool = false) {
        self.name = name
        self.shape = shape
        self.categorical = categorical
    }

    /// Decodes an input, refusing keys it does not know.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: SpecKey.self)
        name = try c.required(String.self, "name")
        try c.rejectUnknown(["name", "shape", "categorical"], in: "input '\(name)'")
        shape = try c.required([Int].self, "shape")
        categorical = try c.required(Bool.self, "categorical")
    }
}

/// The kind of a layer, as its JSON `type` string.
public struct LayerType: RawRepresentable, Sendable, Hashable, Codable, CustomStringConvertible {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    /// Fully connected: `y = x Wᵀ + b`.
    public static let dense = LayerType(rawValue: "dense")
    /// Lookup of rows of a table by category index.
    public static let embedding = LayerType(rawValue: "embedding")
    /// `max(0, x)`.
    public static let relu = LayerType(rawValue: "relu")
    /// `1 / (1 + e^-x)`.
    public static let sigmoid = LayerType(rawValue: "sigmoid")
    /// Hyperbolic tangent.
    public static let tanh = LayerType(rawValue: "tanh")
    /// Softmax over the last axis.
    public static let softmax = LayerType(rawValue: "softmax")
    /// Reshape to one dimension per sample.
    public static let flatten = LayerType(rawValue: "flatten")
    /// Joins several inputs along the last (feature) axis.
    public static let concat = LayerType(rawValue: "concat")
    /// 2-D convolution over `[C, H, W]`.
    public static let conv2d = LayerType(rawValue: "conv2d")
    /// 2-D max pooling over `[C, H, W]`.
    public static let maxPool2d = LayerType(rawValue: "maxPool2d")
    /// 2-D average pooling over `[C, H, W]`; padded positions are left out of each average.
    public static let avgPool2d = LayerType(rawValue: "avgPool2d")
    /// Inverted dropout (active in training only).
    public static let dropout = LayerType(rawValue: "dropout")
    /// 1-D convolution over sequences `[C, L]` (sensor time series), `kernel_size` and `strides` of one element.
    public static let conv1d = LayerType(rawValue: "conv1d")
    /// 1-D max pooling over `[C, L]`.
    public static let maxPool1d = LayerType(rawValue: "maxPool1d")
    /// 1-D average pooling over `[C, L]`; padded positions are left out of each average.
    public static let avgPool1d = LayerType(rawValue: "avgPool1d")

    /// Long short-term memory over `[T, features]` (PyTorch's `nn.LSTM`), optionally with coupled input and forget gates.
    public static let lstm = LayerType(rawValue: "lstm")
    /// Gated recurrent unit over `[T, features]` (PyTorch's `nn.GRU`).
    public static let gru = LayerType(rawValue: "gru")
    /// The same values in another per-sample shape, `target_shape` (an embedding's `[T × E]` as `[T, E]`).
    public static let reshape = LayerType(rawValue: "reshape")

    /// Every type a model may use.
    public static let known: Set<LayerType> = [
        .dense, .embedding, .relu, .sigmoid, .tanh, .softmax, .flatten, .concat, .conv2d, .maxPool2d, .avgPool2d, .dropout, .conv1d, .maxPool1d,
        .avgPool1d, .lstm, .gru, .reshape,
    ]

    /// The recurrent types.
    public static let recurrent: Set<LayerType> = [.lstm, .gru]
}

/// How a convolution or pooling layer pads its input.
public struct Padding: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Kind: Sendable, Hashable { case valid, same, explicit(Int, Int) }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// No padding.
    public static let valid = Padding(.valid)
    /// Output size `ceil(input / stride)`, padding split with the extra row or column after (TensorFlow's rule).
    public static let same = Padding(.same)
    /// A fixed number of zero rows above and below and columns left and right.
    public static func explicit(height: Int, width: Int) -> Padding { Padding(.explicit(height, width)) }

    /// The explicit padding amounts, if this is explicit padding.
    public var explicitAmounts: (height: Int, width: Int)? {
        if case .explicit(let h, let w) = kind { return (h, w) }
        return nil
    }
    /// Whether this is "same" padding.
    public var isSame: Bool { kind == .same }
    /// Whether this is "valid" (no) padding.
    public var isValid: Bool { kind == .valid }

    public var description: String {
        switch kind {
        case .valid: "valid"
        case .same: "same"
        case .explicit(let h, let w): "explicit(\(h),\(w))"
        }
    }

    /// Computes output size and leading padding along one axis.
    /// - Parameters:
    ///   - input: The input length along the axis.
    ///   - kernel: The kernel length along the axis.
    ///   - stride: The stride along the axis.
    ///   - axis: 0 for height, 1 for width (selects the explicit amount).
    /// - Returns: the output length and the zero rows or columns added before the input.
    public func resolve(input: Int, kernel: Int, stride: Int, axis: Int) -> (output: Int, padBefore: Int) {
        switch kind {
        case .valid:
            return (input >= kernel ? (input - kernel) / stride + 1 : 0, 0)
        case .same:
            let out = (input + stride - 1) / stride
            let total = max(0, (out - 1) * stride + kernel - input)
            return (out, total / 2)
        case .explicit(let h, let w):
            let pad = axis == 0 ? h : w
            let padded = input + 2 * pad
            return (padded >= kernel ? (padded - kernel) / stride + 1 : 0, pad)
        }
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let s = try? container.decode(String.self) {
            switch s {
            case "valid": self = .valid
            case "same": self = .same
            default:
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "padding '\(s)' is not valid, same or [h, w]")
            }
        } else {
            let pair = try container.decode([Int].self)
            guard pair.count == 2, pair.allSatisfy({ $0 >= 0 }) else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "explicit padding must be two non-negative integers")
            }
            self = .explicit(height: pair[0], width: pair[1])
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch kind {
        case .valid: try container.encode("valid")
        case .same: try container.encode("same")
        case .explicit(let h, let w): try container.encode([h, w])
        }
    }
}

/// One layer of a model: its kind, what it reads, whether it trains, and the attributes its kind uses.
public struct LayerSpec: Sendable, Hashable, Codable {
    /// The unique layer name; parameters are `<name>.weight` and `<name>.bias` (recurrent layers: `<name>.weight_ih`, …).
    public var name: String
    /// The layer's kind.
    public var type: LayerType
    /// Names of the inputs or earlier layers it reads (several for `concat`).
    public var inputs: [String]
    /// A frozen layer is not updated and does no gradient work it does not need.
    public var frozen: Bool
    /// `dense`: output width; `conv2d`: number of filters; `lstm`/`gru`: hidden width.
    public var units: Int?
    /// `dense`: input width; `lstm`/`gru`: features per step (inferred when building if absent).
    public var inputSize: Int?
    /// `dense`/`conv2d`: whether there is a bias (default true).
    public var useBias: Bool?
    /// `embedding`: number of categories.
    public var vocabularySize: Int?
    /// `embedding`: width of each embedding row.
    public var embeddingSize: Int?
    /// `conv2d`/`maxPool2d`/`avgPool2d`: `[kernelH, kernelW]`; `conv1d`/`maxPool1d`/`avgPool1d`: `[kernel]`.
    public var kernelSize: [Int]?
    /// `conv2d`/`maxPool2d`/`avgPool2d`: `[strideH, strideW]` (default `[1, 1]` for conv, the kernel size for pooling);
    /// the 1-D layers: `[stride]`.
    public var strides: [Int]?
    /// `conv2d`/`maxPool2d`/`avgPool2d`: padding (default valid); the 1-D layers take `valid` or `same`.
    public var padding: Padding?
    /// `conv2d`: input channels (inferred when building if absent).
    public var inChannels: Int?
    /// `dropout`: the probability of zeroing a unit.
    public var rate: Double?
    /// `lstm`/`gru`: whether the output is every step's hidden state `[T, units]` (true) or the last step's `[units]`
    /// (false, the default).
    public var returnSequences: Bool?
    /// `lstm`: whether the input and forget gates are coupled (CIFG, f = 1 − i; default false).
    public var cifg: Bool?
    /// `reshape`: the per-sample output shape (as many values as the input).
    public var targetShape: [Int]?

    /// Creates a layer spec; unused attributes stay nil.
    public init(
        name: String, type: LayerType, inputs: [String], frozen: Bool = false,
        units: Int? = nil, inputSize: Int? = nil, useBias: Bool? = nil,
        vocabularySize: Int? = nil, embeddingSize: Int? = nil,
        kernelSize: [Int]? = nil, strides: [Int]? = nil, padding: Padding? = nil, inChannels: Int? = nil,
        rate: Double? = nil, returnSequences: Bool? = nil, cifg: Bool? = nil, targetShape: [Int]? = nil
    ) {
        self.name = name
        self.type = type
        self.inputs = inputs
        self.frozen = frozen
        self.units = units
        self.inputSize = inputSize
        self.useBias = useBias
        self.vocabularySize = vocabularySize
        self.embeddingSize = embeddingSize
        self.kernelSize = kernelSize
        self.strides = strides
        self.padding = padding
        self.inChannels = inChannels
        self.rate = rate
        self.returnSequences = returnSequences
        self.cifg = cifg
        self.targetShape = targetShape
    }

    /// Decodes a layer, refusing keys it does not know (naming the key and the layer).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: SpecKey.self)
        name = try c.required(String.self, "name")
        try c.rejectUnknown(
            [
                "name", "type", "inputs", "frozen", "units", "input_size", "use_bias", "vocabulary_size", "embedding_size",
                "kernel_size", "strides", "padding", "in_channels", "rate", "return_sequences", "cifg", "target_shape",
            ], in: "layer '\(name)'")
        type = try c.required(LayerType.self, "type")
        inputs = try c.required([String].self, "inputs")
        frozen = try c.optional(Bool.self, "frozen") ?? false
        units = try c.optional(Int.self, "units")
        inputSize = try c.optional(Int.self, "input_size")
        useBias = try c.optional(Bool.self, "use_bias")
        vocabularySize = try c.optional(Int.self, "vocabulary_size")
        embeddingSize = try c.optional(Int.self, "embedding_size")
        kernelSize = try c.optional([Int].self, "kernel_size")
        strides = try c.optional([Int].self, "strides")
        padding = try c.optional(Padding.self, "padding")
        inChannels = try c.optional(Int.self, "in_channels")
        rate = try c.optional(Double.self, "rate")
        returnSequences = try c.optional(Bool.self, "return_sequences")
        cifg = try c.optional(Bool.self, "cifg")
        targetShape = try c.optional([Int].self, "target_shape")
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: SpecKey.self)
        try c.encode(name, forKey: SpecKey("name"))
        try c.encode(type, forKey: SpecKey("type"))
        try c.encode(inputs, forKey: SpecKey("inputs"))
        try c.encode(frozen, forKey: SpecKey("frozen"))
        try c.encodeIfPresent(units, forKey: SpecKey("units"))
        try c.encodeIfPresent(inputSize, forKey: SpecKey("input_size"))
        try c.encodeIfPresent(useBias, forKey: SpecKey("use_bias"))
        try c.encodeIfPresent(vocabularySize, forKey: SpecKey("vocabulary_size"))
        try c.encodeIfPresent(embeddingSize, forKey: SpecKey("embedding_size"))
        try c.encodeIfPresent(kernelSize, forKey: SpecKey("kernel_size"))
        try c.encodeIfPresent(strides, forKey: SpecKey("strides"))
        try c.encodeIfPresent(padding, forKey: SpecKey("padding"))
        try c.encodeIfPresent(inChannels, forKey: SpecKey("in_channels"))
        try c.encodeIfPresent(rate, forKey: SpecKey("rate"))
        try c.encodeIfPresent(returnSequences, forKey: SpecKey("return_sequences"))
        try c.encodeIfPresent(cifg, forKey: SpecKey("cifg"))
        try c.encodeIfPresent(targetShape, forKey: SpecKey("target_shape"))
    }
}

/// The loss a model trains against.
public struct LossType: RawRepresentable, Sendable, Hashable, Codable, CustomStringConvertible {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    /// Mean squared error.
    public static let meanSquaredError = LossType(rawValue: "mse")
    /// Categorical cross-entropy over class indices, fused with the final softmax.
    public static let crossEntropy = LossType(rawValue: "crossEntropy")
}

/// The optimizer a model trains with, and its hyper-parameters.
public struct OptimizerSpec: Sendable, Hashable, Codable {
    /// The optimizer's kind: `sgd` or `adam`.
    public var type: String
    /// Step size.
    public var learningRate: Double
    /// SGD momentum (0 for plain SGD).
    public var momentum: Double
    /// L2 weight decay added to the gradient.
    public var weightDecay: Double
    /// Adam's first-moment decay.
    public var beta1: Double
    /// Adam's second-moment decay.
    public var beta2: Double
    /// Adam's denominator term.
    public var epsilon: Double

    /// Stochastic gradient descent.
    public static func sgd(learningRate: Double = 0.01, momentum: Double = 0, weightDecay: Double = 0) -> OptimizerSpec {
        OptimizerSpec(type: "sgd", learningRate: learningRate, momentum: momentum, weightDecay: weightDecay, beta1: 0.9, beta2: 0.999, epsilon: 1e-8)
    }

    /// Adam (Kingma & Ba 2015).
    public static func adam(learningRate: Double = 0.001, beta1: Double = 0.9, beta2: Double = 0.999, epsilon: Double = 1e-8, weightDecay: Double = 0)
        -> OptimizerSpec
    {
        OptimizerSpec(type: "adam", learningRate: learningRate, momentum: 0, weightDecay: weightDecay, beta1: beta1, beta2: beta2, epsilon: epsilon)
    }

    public init(type: String, learningRate: Double, momentum: Double, weightDecay: Double, beta1: Double, beta2: Double, epsilon: Double) {
        self.type = type
        self.learningRate = learningRate
        self.momentum = momentum
        self.weightDecay = weightDecay
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
    }

    /// Decodes an optimizer, refusing keys it does not know.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: SpecKey.self)
        try c.rejectUnknown(["type", "learning_rate", "momentum", "weight_decay", "beta1", "beta2", "epsilon"], in: "training.optimizer")
        type = try c.required(String.self, "type")
        learningRate = try c.required(Double.self, "learning_rate")
        momentum = try c.optional(Double.self, "momentum") ?? 0
        weightDecay = try c.optional(Double.self, "weight_decay") ?? 0
        beta1 = try c.optional(Double.self, "beta1") ?? 0.9
        beta2 = try c.optional(Double.self, "beta2") ?? 0.999
        epsilon = try c.optional(Double.self, "epsilon") ?? 1e-8
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: SpecKey.self)
        try c.encode(type, forKey: SpecKey("type"))
        try c.encode(learningRate, forKey: SpecKey("learning_rate"))
        try c.encode(momentum, forKey: SpecKey("momentum"))
        try c.encode(weightDecay, forKey: SpecKey("weight_decay"))
        try c.encode(beta1, forKey: SpecKey("beta1"))
        try c.encode(beta2, forKey: SpecKey("beta2"))
        try c.encode(epsilon, forKey: SpecKey("epsilon"))
    }
}

/// How a model is trained: loss, optimizer, epochs and batch size.
public struct TrainingSpec: Sendable, Hashable, Codable {
    /// The loss.
    public var loss: LossType
    /// The optimizer.
    public var optimizer: OptimizerSpec
    /// Passes over the data.
    public var epochs: Int
    /// Samples per update.
    public var batchSize: Int
    /// Stop after this many updates, if set.
    public var maxUpdates: Int?

    /// Creates a training spec.
    public init(loss: LossType, optimizer: OptimizerSpec = .sgd(), epochs: Int = 1, batchSize: Int = 32, maxUpdates: Int? = nil) {
        self.loss = loss
        self.optimizer = optimizer
        self.epochs = epochs
        self.batchSize = batchSize
        self.maxUpdates = maxUpdates
    }

    /// Decodes a training spec, refusing keys it does not know.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: SpecKey.self)
        try c.rejectUnknown(["loss", "optimizer", "epochs", "batch_size", "max_updates"], in: "training")
        loss = try c.required(LossType.self, "loss")
        optimizer = try c.required(OptimizerSpec.self, "optimizer")
        epochs = try c.required(Int.self, "epochs")
        batchSize = try c.required(Int.self, "batch_size")
        maxUpdates = try c.optional(Int.self, "max_updates")
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: SpecKey.self)
        try c.encode(loss, forKey: SpecKey("loss"))
        try c.encode(optimizer, forKey: SpecKey("optimizer"))
        try c.encode(epochs, forKey: SpecKey("epochs"))
        try c.encode(batchSize, forKey: SpecKey("batch_size"))
        try c.encodeIfPresent(maxUpdates, forKey: SpecKey("max_updates"))
    }
}

/// A key of the architecture JSON, written in snake_case; reading also accepts the camelCase spelling of format
/// version 1 (`input_size` or `inputSize`).
struct SpecKey: CodingKey {
    let stringValue: String
    var intValue: Int? { nil }
    init(_ name: String) { stringValue = name }
    init?(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }

    /// The format-1 spelling: `input_size` → `inputSize`.
    var camelCase: SpecKey { SpecKey(Self.camelCase(stringValue)) }

    /// `input_size` → `inputSize`: underscores dropped, the letter after each one (but the first word's) uppercased.
    /// Every model, plan and layer read looks its keys up in both spellings, so the ASCII names all keys have are
    /// converted byte by byte (splitting and joining substrings took most of a training plan's decoding).
    static func camelCase(_ name: String) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(name.utf8.count)
        var upper = false
        for byte in name.utf8 {
            guard byte < 0x80 else { return unicodeCamelCase(name) }
            if byte == UInt8(ascii: "_") {
                upper = !out.isEmpty
                continue
            }
            out.append(upper && (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) ? byte - 0x20 : byte)
            upper = false
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The same conversion for a name that is not ASCII.
    static func unicodeCamelCase(_ name: String) -> String {
        let parts = name.split(separator: "_")
        return parts.prefix(1).joined() + parts.dropFirst().map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined()
    }
}

extension KeyedDecodingContainer where Key == SpecKey {
    /// The value under `name` in snake_case, or in the camelCase of format 1; nil when neither is present.
    func optional<T: Decodable>(_ type: T.Type, _ name: String) throws -> T? {
        let key = SpecKey(name)
        if contains(key) { return try decode(T.self, forKey: key) }
        // A name without an underscore is spelt the same in both formats: it is absent.
        guard name.utf8.contains(UInt8(ascii: "_")) else { return nil }
        return try decodeIfPresent(T.self, forKey: key.camelCase)
    }

    /// The value under `name` (snake_case, or format 1's camelCase); a missing key is named in snake_case.
    func required<T: Decodable>(_ type: T.Type, _ name: String) throws -> T {
        guard let value = try optional(T.self, name) else {
            throw DecodingError.keyNotFound(SpecKey(name), .init(codingPath: codingPath, debugDescription: "missing key '\(name)'"))
        }
        return value
    }

    /// Throws a `DecodingError` naming the first key of this object that is neither one of `known` (snake_case) nor
    /// its format-1 camelCase spelling, and `owner` (e.g. `layer 'dense1'`); the message lists the snake_case keys.
    func rejectUnknown(_ known: [String], in owner: @autoclosure () -> String) throws {
        // An object has a handful of keys: each is compared with the known names and with format 1's camelCase
        // spelling of those that have an underscore, rather than building a set of both spellings per object.
        let unknowns = allKeys.map(\.stringValue).filter { key in
            !known.contains(key) && !known.contains { $0.utf8.contains(UInt8(ascii: "_")) && SpecKey.camelCase($0) == key }
        }
        guard let unknown = unknowns.min() else { return }
        throw DecodingError.dataCorruptedError(
            forKey: SpecKey(unknown), in: self,
            debugDescription: "\(owner()) has unknown key '\(unknown)' (known keys: \(known.joined(separator: ", ")))"
        )
    }
}
