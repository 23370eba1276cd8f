import OrchardSupport
public import OrchardFormats

/// A model: named inputs, a list of layers each reading earlier layers or inputs, and an output layer.
///
/// Build one with the layer DSL, from a list of layers (the classic API), or from an architecture JSON
/// `ModelSpec`; ``spec`` gives the JSON back. Parameters are addressable by name (`<layer>.weight`,
/// `<layer>.bias`) and as one flat vector ordered by name.
///
/// ```swift
/// let model = try Model(name: "mlp", inputShape: [784], seed: 1) {
///     Dense(units: 200); ReLU()
///     Dense(units: 10); Softmax()
/// }
/// ```
public struct Model: Sendable {
    /// A display name.
    public var name: String
    /// The named inputs.
    public private(set) var inputs: [InputSpec]
    /// The layers in evaluation order, each with a unique name.
    public private(set) var layers: [any Layer]
    /// The name of the layer whose output is the model's output.
    public private(set) var output: String
    /// How the model is meant to be trained, if known.
    public var training: TrainingSpec?
    /// Per-sample output shape of every input and layer, by name.
    public private(set) var shapes: [String: [Int]]

    /// Builds a model from named inputs and layers (the classic API).
    ///
    /// Unnamed layers are named `<type><n>` (e.g. `dense1`); a layer with no ``Layer/inputNames`` reads the
    /// previous layer, or the only input for the first layer. Missing parameters are initialised from `seed`.
    /// - Parameters:
    ///   - name: A display name.
    ///   - inputs: The model inputs.
    ///   - layers: The layers in evaluation order.
    ///   - output: The output layer's name (default: the last layer).
    ///   - training: How the model is meant to be trained.
    ///   - seed: Seed for parameter initialisation.
    public init(
        name: String, inputs: [InputSpec], layers: [any Layer], output: String? = nil,
        training: TrainingSpec? = nil, seed: UInt64 = 0
    ) throws(EngineError) {
        self.name = name
        self.inputs = inputs
        self.training = training
        var random = OrchardRandom(seed: seed)
        var shapes: [String: [Int]] = [:]
        for input in inputs {
            guard !input.name.isEmpty, shapes[input.name] == nil else {
                throw EngineError(.invalidModel, "input name '\(input.name)' is empty or repeated")
            }
            guard !input.shape.isEmpty, input.shape.allSatisfy({ $0 > 0 }) else {
                throw EngineError(.invalidModel, "input '\(input.name)' has invalid shape \(input.shape)")
            }
            shapes[input.name] = input.shape
        }
        var counters: [LayerType: Int] = [:]
        var built: [any Layer] = []
        var previous: String? = inputs.count == 1 ? inputs[0].name : nil
        for var layer in layers {
            if layer.name.isEmpty {
                var n = counters[layer.type, default: 0]
                repeat { n += 1 } while shapes["\(layer.type.rawValue.lowercased())\(n)"] != nil
                counters[layer.type] = n
                layer.name = "\(layer.type.rawValue.lowercased())\(n)"
            }
            guard !layer.name.contains("."), shapes[layer.name] == nil else {
                throw EngineError(.invalidModel, "layer name '\(layer.name)' contains '.' or is repeated")
            }
            if layer.inputNames.isEmpty {
                guard let previous else {
                    throw EngineError(.invalidModel, "layer '\(layer.name)' does not say which of the inputs \(inputs.map(\.name)) it reads")
                }
                layer.inputNames = [previous]
            }
            var inputShapes: [[Int]] = []
            for source in layer.inputNames {
                guard let shape = shapes[source] else {
                    throw EngineError(.invalidModel, "layer '\(layer.name)' reads '\(source)', which is not an input or earlier layer")
                }
                inputShapes.append(shape)
            }
            if layer.type != .concat && inputShapes.count != 1 {
                throw EngineError(.invalidModel, "layer '\(layer.name)' (\(layer.type)) takes one input, not \(inputShapes.count)")
            }
            if layer.type == .embedding, let source = inputs.first(where: { $0.name == layer.inputNames[0] }), !source.categorical {
                throw EngineError(.invalidModel, "embedding '\(layer.name)' reads input '\(source.name)', which is not categorical")
            }
            try layer.build(inputShapes: inputShapes, random: &random)
            shapes[layer.name] = try layer.outputShape(for: inputShapes)
            built.append(layer)
            previous = layer.name
        }
        guard !built.isEmpty else { throw EngineError(.invalidModel, "model '\(name)' has no layers") }
        let outputName = output ?? built.last!.name
        guard built.contains(where: { $0.name == outputName }) else {
            throw EngineError(.invalidModel, "output '\(outputName)' is not a layer")
        }
        self.layers = built
        self.output = outputName
        self.shapes = shapes
    }

    /// Builds a model with the layer DSL.
    public init(
        name: String, inputs: [InputSpec], output: String? = nil, training: TrainingSpec? = nil, seed: UInt64 = 0,
        @LayerBuilder layers: () -> [any Layer]
    ) throws(EngineError) {
        try self.init(name: name, inputs: inputs, layers: layers(), output: output, training: training, seed: seed)
    }

    /// Builds a sequential model with one input named `input`.
    public init(
        name: String, inputShape: [Int], training: TrainingSpec? = nil, seed: UInt64 = 0,
        @LayerBuilder layers: () -> [any Layer]
    ) throws(EngineError) {
        try self.init(name: name, inputs: [InputSpec(name: "input", shape: inputShape)], layers: layers(), training: training, seed: seed)
    }

    /// Builds a model from its architecture JSON, initialising parameters from `seed`.
    public init(spec: ModelSpec, seed: UInt64 = 0) throws(EngineError) {
        // Structure, size limits and every shape's element count, before any layer multiplies sizes it was given.
        do { _ = try spec.layerShapes() } catch { throw EngineError(.invalidModel, error.message) }
        var layers: [any Layer] = []
        for l in spec.layers {
            layers.append(try Self.layer(from: l))
        }
        try self.init(name: spec.name, inputs: spec.inputs, layers: layers, output: spec.output, training: spec.training, seed: seed)
    }

    private static func layer(from s: LayerSpec) throws(EngineError) -> any Layer {
        func need<T>(_ value: T?, _ attribute: String) throws(EngineError) -> T {
            guard let value else { throw EngineError(.invalidModel, "layer '\(s.name)' (\(s.type)) needs '\(attribute)'") }
            return value
        }
        func pair(_ value: [Int]?, _ attribute: String) throws(EngineError) -> [Int]? {
            guard let value else { return nil }
            guard value.count == 2, value.allSatisfy({ $0 > 0 }) else {
                throw EngineError(.invalidModel, "layer '\(s.name)': '\(attribute)' must be two positive integers, not \(value)")
            }
            return value
        }
        func positive(_ value: Int, _ attribute: String) throws(EngineError) -> Int {
            guard value > 0 else { throw EngineError(.invalidModel, "layer '\(s.name)': '\(attribute)' must be positive, not \(value)") }
            return value
        }
        let layer: any Layer
        switch s.type {
        case .dense:
            layer = Dense(units: try positive(try need(s.units, "units"), "units"), inputSize: s.inputSize, useBias: s.useBias ?? true)
        case .embedding:
            layer = Embedding(
                vocabularySize: try positive(try need(s.vocabularySize, "vocabularySize"), "vocabularySize"),
                embeddingSize: try positive(try need(s.embeddingSize, "embeddingSize"), "embeddingSize")
            )
        case .relu: layer = ReLU()
        case .sigmoid: layer = Sigmoid()
        case .tanh: layer = Tanh()
        case .softmax: layer = Softmax()
        case .flatten: layer = Flatten()
        case .reshape:
            let target = try need(s.targetShape, "target_shape")
            guard !target.isEmpty, target.allSatisfy({ $0 > 0 }) else {
                throw EngineError(.invalidModel, "layer '\(s.name)': 'target_shape' must be one or more positive sizes, not \(target)")
            }
            layer = Reshape(target)
        case .concat: layer = Concat()
        case .dropout:
            let rate = try need(s.rate, "rate")
            guard rate >= 0 && rate < 1 else { throw EngineError(.invalidModel, "dropout '\(s.name)': rate \(rate) is not in [0, 1)") }
            layer = Dropout(rate: Float(rate))
        case .conv2d:
            layer = Conv2D(
                filters: try positive(try need(s.units, "units"), "units"), kernelSize: try need(try pair(s.kernelSize, "kernelSize"), "kernelSize"),
                strides: try pair(s.strides, "strides") ?? [1, 1], padding: s.padding ?? .valid, useBias: s.useBias ?? true,
                inChannels: s.inChannels
            )
        case .maxPool2d:
            layer = MaxPool2D(
                poolSize: try need(try pair(s.kernelSize, "kernelSize"), "kernelSize"),
                strides: try pair(s.strides, "strides"), padding: s.padding ?? .valid
            )
        case .avgPool2d:
            layer = AvgPool2D(
                poolSize: try need(try pair(s.kernelSize, "kernelSize"), "kernelSize"),
                strides: try pair(s.strides, "strides"), padding: s.padding ?? .valid
            )
        case .conv1d, .maxPool1d, .avgPool1d:
            func single(_ value: [Int]?, _ attribute: String) throws(EngineError) -> Int? {
                guard let value else { return nil }
                guard value.count == 1, value[0] > 0 else {
                    throw EngineError(.invalidModel, "layer '\(s.name)': '\(attribute)' must be one positive integer, [n], not \(value)")
                }
                return value[0]
            }
            let padding = s.padding ?? .valid
            guard padding == .valid || padding == .same else {
                throw EngineError(.invalidModel, "layer '\(s.name)': the padding of a 1-D layer is valid or same, not \(padding)")
            }
            let kernel = try need(try single(s.kernelSize, "kernelSize"), "kernelSize")
            let stride = try single(s.strides, "strides")
            switch s.type {
            case .conv1d:
                layer = Conv1D(
                    filters: try positive(try need(s.units, "units"), "units"), kernelSize: kernel, stride: stride ?? 1, padding: padding,
                    useBias: s.useBias ?? true, inChannels: s.inChannels)
            case .maxPool1d: layer = MaxPool1D(poolSize: kernel, stride: stride, padding: padding)
            default: layer = AvgPool1D(poolSize: kernel, stride: stride, padding: padding)
            }
        case .lstm:
            layer = LSTM(
                units: try positive(try need(s.units, "units"), "units"), returnSequences: s.returnSequences ?? false, cifg: s.cifg ?? false,
                useBias: s.useBias ?? true, inputSize: s.inputSize)
        case .gru:
            if s.cifg != nil { throw EngineError(.invalidModel, "layer '\(s.name)' (gru): 'cifg' is an LSTM option") }
            layer = GRU(
                units: try positive(try need(s.units, "units"), "units"), returnSequences: s.returnSequences ?? false, useBias: s.useBias ?? true,
                inputSize: s.inputSize)
        default:
            throw EngineError(.invalidModel, "layer '\(s.name)' has unknown type '\(s.type)'")
        }
        return layer.named(s.name).reading(s.inputs).frozen(s.frozen)
    }

    /// The architecture as JSON-ready spec.
    public var spec: ModelSpec {
        ModelSpec(name: name, inputs: inputs, layers: layers.map(\.spec), output: output, training: training)
    }

    /// The per-sample output shape.
    public var outputShape: [Int] { shapes[output]! }

    /// The layer with `name`, if any.
    public func layer(named name: String) -> (any Layer)? { layers.first { $0.name == name } }

    /// Marks a layer frozen or trainable.
    public mutating func setFrozen(_ frozen: Bool, layer name: String) throws(EngineError) {
        guard let i = layers.firstIndex(where: { $0.name == name }) else {
            throw EngineError(.invalidArgument, "model '\(self.name)' has no layer '\(name)'")
        }
        layers[i].isFrozen = frozen
    }

    // MARK: Parameters

    /// Every parameter by full name (`<layer>.<suffix>`).
    public var namedParameters: [String: Tensor] {
        var all: [String: Tensor] = [:]
        for layer in layers {
            for (suffix, value) in layer.parameters { all["\(layer.name).\(suffix)"] = value }
        }
        return all
    }

    /// Parameter names in flat-vector order (sorted).
    public var parameterNames: [String] { namedParameters.keys.sorted() }

    /// Names of the parameters of layers that are not frozen, sorted.
    public var trainableParameterNames: [String] {
        layers.filter { !$0.isFrozen }.flatMap { l in l.parameters.keys.map { "\(l.name).\($0)" } }.sorted()
    }

    /// Shape of every parameter by name.
    public var parameterShapes: [String: [Int]] { namedParameters.mapValues(\.shape) }

    /// Total number of parameter values.
    public var parameterCount: Int { namedParameters.values.reduce(0) { $0 + $1.count } }

    /// The parameter with a full name, if any.
    public func parameter(_ name: String) -> Tensor? {
        let (layerName, suffix) = Self.split(name)
        return layer(named: layerName)?.parameters[suffix]
    }

    /// Replaces a parameter, checking that it exists and keeps its shape.
    public mutating func setParameter(_ name: String, to value: Tensor) throws(EngineError) {
        let (layerName, suffix) = Self.split(name)
        guard let i = layers.firstIndex(where: { $0.name == layerName }), layers[i].parameters[suffix] != nil else {
            throw EngineError(.invalidArgument, "model '\(self.name)' has no parameter '\(name)'")
        }
        try layers[i].setParameter(suffix, to: value)
    }

    static func split(_ name: String) -> (String, String) {
        guard let dot = name.lastIndex(of: ".") else { return (name, "") }
        return (String(name[..<dot]), String(name[name.index(after: dot)...]))
    }

    /// All parameter values as one vector, parameters ordered by name.
    public func flatParameters() -> [Float] {
        let params = namedParameters
        return params.keys.sorted().flatMap { params[$0]!.scalars }
    }

    /// Replaces all parameters from one vector laid out as ``flatParameters()``.
    public mutating func setFlatParameters(_ values: [Float]) throws(EngineError) {
        let params = namedParameters
        let total = params.values.reduce(0) { $0 + $1.count }
        guard values.count == total else {
            throw EngineError(.shapeMismatch, "model '\(name)' has \(total) parameter values, not \(values.count)")
        }
        var offset = 0
        for key in params.keys.sorted() {
            let shape = params[key]!.shape, n = params[key]!.count
            try setParameter(key, to: Tensor(shape: shape, scalars: Array(values[offset..<(offset + n)])))
            offset += n
        }
    }

    // MARK: Inference

    /// Runs the model on batch-first tensors, one per input name.
    public func callAsFunction(_ feeds: [String: Tensor]) throws(EngineError) -> Tensor {
        var values: [String: Tensor] = [:]
        var batch: Int?
        for input in inputs {
            guard let t = feeds[input.name] else { throw EngineError(.invalidArgument, "no value for input '\(input.name)'") }
            guard t.shape.count == input.shape.count + 1, Array(t.shape.dropFirst()) == input.shape, batch == nil || batch == t.shape[0] else {
                throw EngineError(.shapeMismatch, "input '\(input.name)' must be [batch] + \(input.shape), got \(t.shape)")
            }
            batch = t.shape[0]
            values[input.name] = t
        }
        for layer in layers {
            if let embedding = layer as? Embedding {
                let indices = values[layer.inputNames[0]]!
                if let bad = indices.scalars.first(where: { !($0 >= 0 && $0 < Float(embedding.vocabularySize)) || $0 != $0.rounded(.towardZero) }) {
                    throw EngineError(.invalidArgument, "embedding '\(layer.name)': index \(bad) is not in 0..<\(embedding.vocabularySize)")
                }
            }
            let out = layer(layer.inputNames.map { values[$0]! })
            values[layer.name] = out.reshaped([out.shape[0]] + shapes[layer.name]!)
            if layer.name == output { return values[layer.name]! }
        }
        return values[output]!
    }

    /// Runs a single-input model on a batch-first tensor.
    public func callAsFunction(_ input: Tensor) throws(EngineError) -> Tensor {
        guard inputs.count == 1 else {
            throw EngineError(.invalidArgument, "model '\(name)' has \(inputs.count) inputs; pass them by name")
        }
        return try self([inputs[0].name: input])
    }
}
