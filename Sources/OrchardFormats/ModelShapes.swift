/// One parameter tensor a model's architecture implies, with the layer field each of its dimensions comes from.
public struct ParameterSpec: Sendable, Hashable {
    /// The tensor's name, `<layer>.weight` or `<layer>.bias`.
    public var name: String
    /// The layer it belongs to.
    public var layer: String
    /// The layer's type.
    public var type: LayerType
    /// The shape the architecture implies.
    public var shape: [Int]
    /// For each dimension, the layer field (or inferred quantity) it is taken from, e.g. `units`, `inputSize`.
    public var fields: [String]
}

extension ModelSpec {
    /// The parameters the architecture implies, sorted by name: per-sample shapes are inferred layer by layer
    /// under the conventions of ``ModelSpec`` (the rules the engine builds a model with), without building it.
    /// - Throws: ``FormatError`` (`invalid_spec`) naming the layer and the field when the architecture does not
    ///   build: a missing or non-positive attribute, an input of the wrong rank, a stated size that differs from
    ///   the one inferred.
    public func parameters() throws(FormatError) -> [ParameterSpec] {
        try inferred().parameters
    }

    /// Each input's and layer's per-sample output shape, inferred as ``parameters()`` infers them.
    public func layerShapes() throws(FormatError) -> [String: [Int]] {
        try inferred().shapes
    }

    private func inferred() throws(FormatError) -> (parameters: [ParameterSpec], shapes: [String: [Int]]) {
        try validate()
        try validateArchitectureLimits()
        var shapes: [String: [Int]] = [:]
        for input in inputs {
            guard Self.elementCount(input.shape) != nil else {
                throw FormatError(.invalidSpec, "input '\(input.name)' of shape \(input.shape) has more than \(Self.maximumElementCount) elements")
            }
            shapes[input.name] = input.shape
        }
        var parameters: [ParameterSpec] = []
        for layer in layers {
            let inputShapes = layer.inputs.map { shapes[$0] ?? [] }
            let (output, implied) = try Self.infer(layer, inputShapes: inputShapes)
            for shape in [output] + implied.map(\.shape) where Self.elementCount(shape) == nil {
                throw FormatError(.invalidSpec, "layer '\(layer.name)' (\(layer.type)): shape \(shape) has more than \(Self.maximumElementCount) elements")
            }
            shapes[layer.name] = output
            parameters += implied
        }
        return (parameters.sorted { $0.name < $1.name }, shapes)
    }

    /// Checks a set of named weight shapes against the architecture: every implied parameter present with its
    /// shape, nothing else.
    /// - Throws: ``FormatError``: `missing_tensor`, `unexpected_tensor` or `shape_mismatch` naming the tensor,
    ///   the layer and the field a wrong dimension comes from; `invalid_spec` when the architecture itself does not build.
    public func checkWeights(_ shapes: [String: [Int]]) throws(FormatError) {
        let expected = try parameters()
        let byName = Dictionary(expected.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        for parameter in expected {
            guard let shape = shapes[parameter.name] else {
                throw FormatError(
                    .missingTensor, "weight '\(parameter.name)' of layer '\(parameter.layer)' (\(parameter.type)) is missing; its shape is \(parameter.shape)")
            }
            guard shape == parameter.shape else {
                var detail = ""
                if shape.count == parameter.shape.count,
                    let axis = zip(shape, parameter.shape).enumerated().first(where: { $0.element.0 != $0.element.1 })?.offset
                {
                    detail = ": dimension \(axis) is the layer's '\(parameter.fields[axis])', \(parameter.shape[axis]), not \(shape[axis])"
                }
                throw FormatError(
                    .shapeMismatch,
                    "weight '\(parameter.name)' has shape \(shape); layer '\(parameter.layer)' (\(parameter.type)) implies \(parameter.shape)\(detail)"
                )
            }
        }
        for name in shapes.keys.sorted() where byName[name] == nil {
            let layerName = String(name.split(separator: ".", maxSplits: 1).first ?? "")
            if let layer = layers.first(where: { $0.name == layerName }) {
                let why = layer.useBias == false && name == "\(layerName).bias" ? " (its 'use_bias' is false)" : ""
                throw FormatError(.unexpectedTensor, "weight '\(name)' is not a parameter of layer '\(layerName)' (\(layer.type))\(why)")
            }
            throw FormatError(.unexpectedTensor, "weight '\(name)' does not belong to a layer of model '\(self.name)'")
        }
    }

    /// The element count of a shape, or nil when it exceeds ``maximumElementCount`` (or overflows).
    static func elementCount(_ shape: [Int]) -> Int? {
        var count = 1
        for dimension in shape {
            let (product, overflow) = count.multipliedReportingOverflow(by: dimension)
            guard !overflow, product <= maximumElementCount else { return nil }
            count = product
        }
        return count
    }

    private static func infer(_ layer: LayerSpec, inputShapes: [[Int]]) throws(FormatError) -> (output: [Int], parameters: [ParameterSpec]) {
        func fail(_ message: String) -> FormatError { FormatError(.invalidSpec, "layer '\(layer.name)' (\(layer.type)): \(message)") }
        func positive(_ value: Int?, _ field: String) throws(FormatError) -> Int {
            guard let value else { throw fail("'\(field)' is required") }
            guard value > 0 else { throw fail("'\(field)' must be positive, not \(value)") }
            return value
        }
        func pair(_ value: [Int]?, _ field: String) throws(FormatError) -> [Int]? {
            guard let value else { return nil }
            guard value.count == 2, value.allSatisfy({ $0 > 0 }) else { throw fail("'\(field)' must be two positive integers, not \(value)") }
            return value
        }
        func parameter(_ suffix: String, _ shape: [Int], _ fields: [String]) -> ParameterSpec {
            ParameterSpec(name: "\(layer.name).\(suffix)", layer: layer.name, type: layer.type, shape: shape, fields: fields)
        }
        func single(_ value: [Int]?, _ field: String) throws(FormatError) -> Int? {
            guard let value else { return nil }
            guard value.count == 1, value[0] > 0 else { throw fail("'\(field)' must be one positive integer, [n], not \(value)") }
            return value[0]
        }
        let input = inputShapes.first ?? []
        switch layer.type {
        case .conv1d, .maxPool1d, .avgPool1d:
            guard input.count == 2 else { throw fail("needs a [C, L] input (channels, steps), not \(input)") }
            guard let kernel = try single(layer.kernelSize, "kernel_size") else { throw fail("'kernel_size' is required") }
            let convolution = layer.type == .conv1d
            let stride = try single(layer.strides, "strides") ?? (convolution ? 1 : kernel)
            let padding = layer.padding ?? .valid
            guard padding == .valid || padding == .same else { throw fail("'padding' of a 1-D layer is valid or same, not \(padding)") }
            let length = padding.resolve(input: input[1], kernel: kernel, stride: stride, axis: 1).output
            guard length > 0 else { throw fail("'kernel_size' [\(kernel)] does not fit input \(input) with padding \(padding)") }
            guard convolution else { return ([input[0], length], []) }
            let filters = try positive(layer.units, "units")
            if let channels = layer.inChannels, channels != input[0] {
                throw fail("'in_channels' is \(channels), but its input '\(layer.inputs[0])' has \(input[0]) channels")
            }
            var implied = [parameter("weight", [filters, input[0], kernel], ["units", "in_channels", "kernel_size[0]"])]
            if layer.useBias ?? true { implied.append(parameter("bias", [filters], ["units"])) }
            return ([filters, length], implied)
        case .lstm, .gru:
            guard input.count == 2 else { throw fail("needs a [T, features] input (steps, features), not \(input)") }
            let units = try positive(layer.units, "units")
            if let size = layer.inputSize, size != input[1] {
                throw fail("'input_size' is \(size), but its input '\(layer.inputs[0])' has \(input[1]) features per step")
            }
            if layer.type == .gru, layer.cifg != nil { throw fail("'cifg' is an LSTM option") }
            let gates = layer.type == .gru || layer.cifg == true ? 3 : 4
            let rows = "\(gates) × units"
            var implied = [
                parameter("weight_ih", [gates * units, input[1]], [rows, "input_size"]),
                parameter("weight_hh", [gates * units, units], [rows, "units"]),
            ]
            if layer.useBias ?? true {
                implied += [parameter("bias_ih", [gates * units], [rows]), parameter("bias_hh", [gates * units], [rows])]
            }
            return (layer.returnSequences == true ? [input[0], units] : [units], implied)
        case .dense:
            // Over the last axis (PyTorch's nn.Linear): [T, features] becomes [T, units].
            guard let width = input.last else { throw fail("needs an input of rank 1 or more per sample, not \(input)") }
            let units = try positive(layer.units, "units")
            if let size = layer.inputSize, size != width {
                throw fail("'input_size' is \(size), but its input '\(layer.inputs[0])' has width \(width)")
            }
            var implied = [parameter("weight", [units, width], ["units", "input_size"])]
            if layer.useBias ?? true { implied.append(parameter("bias", [units], ["units"])) }
            return (input.dropLast() + [units], implied)
        case .reshape:
            guard let target = layer.targetShape, !target.isEmpty, target.allSatisfy({ $0 > 0 }) else {
                throw fail("'target_shape' is required: one or more positive sizes")
            }
            guard elementCount(target) == elementCount(input) else {
                throw fail("'target_shape' \(target) does not hold the \(elementCount(input).map(String.init) ?? "many") values of input \(input)")
            }
            return (target, [])
        case .embedding:
            guard input.count == 1 else { throw fail("needs a rank-1 input of indices, not \(input)") }
            let vocabulary = try positive(layer.vocabularySize, "vocabulary_size")
            let width = try positive(layer.embeddingSize, "embedding_size")
            guard let outputWidth = elementCount([input[0], width]) else { throw fail("output width \(input[0]) × \(width) is too large") }
            return ([outputWidth], [parameter("weight", [vocabulary, width], ["vocabulary_size", "embedding_size"])])
        case .relu, .sigmoid, .tanh, .softmax:
            return (input, [])
        case .dropout:
            guard let rate = layer.rate else { throw fail("'rate' is required") }
            guard rate >= 0 && rate < 1 else { throw fail("'rate' must be in [0, 1), not \(rate)") }
            return (input, [])
        case .flatten:
            guard let count = elementCount(input) else { throw fail("input \(input) has too many elements") }
            return ([count], [])
        case .concat:
            guard !input.isEmpty else { throw fail("needs inputs of rank 1 or more") }
            let leading = input.dropLast()
            guard inputShapes.allSatisfy({ $0.count == input.count && $0.dropLast() == leading }) else {
                throw fail("inputs differ in their leading dimensions: \(inputShapes)")
            }
            guard let width = elementCount([inputShapes.reduce(0) { $0 + ($1.last ?? 0) }]) else { throw fail("joined width is too large") }
            return (Array(leading) + [width], [])
        case .conv2d, .maxPool2d, .avgPool2d:
            guard input.count == 3 else { throw fail("needs a [C, H, W] input, not \(input)") }
            guard let kernel = try pair(layer.kernelSize, "kernel_size") else { throw fail("'kernel_size' is required") }
            let convolution = layer.type == .conv2d
            let strides = try pair(layer.strides, "strides") ?? (convolution ? [1, 1] : kernel)
            let padding = layer.padding ?? .valid
            let height = padding.resolve(input: input[1], kernel: kernel[0], stride: strides[0], axis: 0).output
            let width = padding.resolve(input: input[2], kernel: kernel[1], stride: strides[1], axis: 1).output
            guard height > 0 && width > 0 else { throw fail("'kernel_size' \(kernel) does not fit input \(input) with padding \(padding)") }
            guard convolution else { return ([input[0], height, width], []) }
            let filters = try positive(layer.units, "units")
            if let channels = layer.inChannels, channels != input[0] {
                throw fail("'in_channels' is \(channels), but its input '\(layer.inputs[0])' has \(input[0]) channels")
            }
            var implied = [parameter("weight", [filters, input[0], kernel[0], kernel[1]], ["units", "in_channels", "kernel_size[0]", "kernel_size[1]"])]
            if layer.useBias ?? true { implied.append(parameter("bias", [filters], ["units"])) }
            return ([filters, height, width], implied)
        default:
            throw fail("unknown type '\(layer.type)'")
        }
    }
}
