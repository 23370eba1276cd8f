public import OrchardFormats

/// An Orchard model read from a Core ML file.
public struct CoreMLImportedModel: Sendable, Hashable {
    /// The architecture, with `training` when the file is an updatable model.
    public var spec: ModelSpec
    /// The parameters in Orchard's layouts, named `<layer>.weight` / `<layer>.bias`.
    public var weights: [TensorRecord]
    /// A classifier's labels in class-index order (integer labels as decimal strings); empty otherwise.
    public var classLabels: [String]
    /// The on-device hyper-parameter ranges of an updatable model.
    public var ranges: CoreMLUpdateRanges?
    /// The file's descriptive metadata.
    public var metadata: CoreMLMetadata
}

/// Settings for ``CoreMLImporter``.
public struct CoreMLImportOptions: Sendable, Hashable {
    /// The name given to the model when the file does not carry an Orchard model name.
    public var defaultModelName: String

    /// Creates options; every field has a default.
    public init(defaultModelName: String = "coreml-model") {
        self.defaultModelName = defaultModelName
    }
}

/// Reads a Core ML neural network (plain, classifier or regressor) into an Orchard architecture and weights.
///
/// Supported layers: inner product, embedding, activations (ReLU, sigmoid, tanh, and the identity linear
/// activation, which is left out), softmax, flatten, concat, convolution and max pooling; anything else is a
/// ``CoreMLError`` naming the layer and its Core ML type. An updatable file's loss, optimizer, epochs and batch size
/// become the spec's `training`; its non-updatable layers become frozen layers.
public struct CoreMLImporter: Sendable {
    /// The import settings.
    public var options: CoreMLImportOptions

    /// Creates an importer.
    public init(options: CoreMLImportOptions = CoreMLImportOptions()) {
        self.options = options
    }

    /// Decodes `.mlmodel` bytes.
    public func importModel(from bytes: [UInt8]) throws(CoreMLError) -> CoreMLImportedModel {
        try importModel(CoreMLCoding.decode(bytes))
    }

    func importModel(_ model: ProtoModel) throws(CoreMLError) -> CoreMLImportedModel {
        let network = try CoreMLNetwork(model)
        let exact = network.shapeMapping == .exactArrayMapping
        guard exact || network.shapeMapping == .rank5ArrayMapping else {
            throw CoreMLError(.unsupportedFeature, "the network uses array shape mapping \(network.shapeMapping.rawValue), which Orchard does not know")
        }
        try CoreMLUpdateRules.check(model, network: network)
        let updatable = model.isUpdatable
        let description = model.description_p

        var inputs: [InputSpec] = []
        var inputShapes: [String: [Int]] = [:]
        var inputRanks: [String: Int] = [:]
        for feature in description.input {
            let (shape, rank) = try arrayShape(feature, role: "input", exact: exact)
            inputs.append(InputSpec(name: feature.name, shape: shape))
            inputShapes[feature.name] = shape
            inputRanks[feature.name] = rank
        }
        // What each layer read (by position: a blob name an in-place layer writes again has another shape afterwards).
        var read: [[[Int]]] = []
        _ =
            exact
            ? try CoreMLShapes.exactBlobShapes(inputs: inputShapes, ranks: inputRanks, layers: network.layers, lenient: false, read: &read)
            : try CoreMLShapes.blobShapes(inputs: inputShapes, layers: network.layers, lenient: false, read: &read)

        var names = Names(taken: Set(inputs.map(\.name)))
        var blobToName: [String: String] = Dictionary(uniqueKeysWithValues: inputs.map { ($0.name, $0.name) })
        var layers: [LayerSpec] = []
        var weights: [TensorRecord] = []
        var categorical = Set<String>()
        for (position, layer) in network.layers.enumerated() {
            guard layer.output.count == 1 else {
                throw CoreMLError(.unsupportedLayer, "\(layer.typeName) layer has \(layer.output.count) outputs; Orchard layers have one", layer: layer.name)
            }
            var sources: [String] = []
            for blob in layer.input {
                guard let source = blobToName[blob] else {
                    throw CoreMLError(.invalidModel, "reads '\(blob)', which no earlier layer or input produces", layer: layer.name)
                }
                sources.append(source)
            }
            let inputShapes = read[position]
            if case .activation(let a) = layer.layer, case .linear(let linear) = a.nonlinearityType {
                guard linear.alpha == 1, linear.beta == 0 else {
                    throw CoreMLError(
                        .unsupportedLayer, "linear activation \(linear.alpha)·x + \(linear.beta) has no Orchard counterpart (only the identity does)",
                        layer: layer.name)
                }
                blobToName[layer.output[0]] = sources[0]
                continue
            }
            let name = names.make(from: layer.name)
            var spec = LayerSpec(name: name, type: .dense, inputs: sources)
            let frozen = updatable && !layer.isUpdatable
            switch layer.layer {
            case .innerProduct(let p):
                spec.type = .dense
                spec.units = Int(p.outputChannels)
                spec.inputSize = Int(p.inputChannels)
                spec.useBias = p.hasBias_p
                spec.frozen = frozen
                weights.append(try record("\(name).weight", [Int(p.outputChannels), Int(p.inputChannels)], p.weights, layer: layer, role: "weight"))
                if p.hasBias_p {
                    weights.append(try record("\(name).bias", [Int(p.outputChannels)], p.bias, layer: layer, role: "bias"))
                }
            case .embedding(let p):
                guard !p.hasBias_p else {
                    throw CoreMLError(.unsupportedFeature, "the embedding has a bias; Orchard embeddings have none", layer: layer.name)
                }
                let (vocabulary, width) = (Int(p.inputDim), Int(p.outputChannels))
                spec.type = .embedding
                spec.vocabularySize = vocabulary
                spec.embeddingSize = width
                spec.frozen = updatable
                let table = try record("\(name).weight", [width, vocabulary], p.weights, layer: layer, role: "weight")
                weights.append(TensorRecord(name: table.name, shape: [vocabulary, width], values: transpose(table.values, rows: width, columns: vocabulary)))
                if inputShapes[0] != [1] {
                    throw CoreMLError(
                        .unsupportedLayer, "the embedding reads shape \(inputShapes[0]); Orchard embeddings read one index of shape [1]", layer: layer.name)
                }
                categorical.insert(sources[0])
            case .activation(let a):
                switch a.nonlinearityType {
                case .reLu: spec.type = .relu
                case .sigmoid: spec.type = .sigmoid
                case .tanh: spec.type = .tanh
                default:
                    throw CoreMLError(.unsupportedLayer, "layer type '\(layer.typeName)' has no Orchard counterpart", layer: layer.name)
                }
            case .softmax:
                guard inputShapes[0].count == 1 else {
                    throw CoreMLError(
                        .unsupportedLayer, "softmax over the channels of a \(inputShapes[0]) input; Orchard's softmax normalizes the last axis of a vector",
                        layer: layer.name)
                }
                spec.type = .softmax
            case .flatten(let p):
                let input = inputShapes[0]
                if p.mode == .channelLast, input.count == 3, input[1] * input[2] > 1 {
                    throw CoreMLError(.unsupportedLayer, "channel-last flatten; Orchard flattens channels first", layer: layer.name)
                }
                spec.type = .flatten
            case .concat:
                guard inputShapes.allSatisfy({ $0.count == 1 }) else {
                    throw CoreMLError(.unsupportedLayer, "concat of \(inputShapes) along channels; Orchard concatenates vectors", layer: layer.name)
                }
                spec.type = .concat
            case .convolution(let p):
                try convolution(p, into: &spec, weights: &weights, layer: layer, frozen: frozen)
            case .pooling(let p):
                try pooling(p, into: &spec, layer: layer, input: inputShapes[0])
            case nil:
                throw CoreMLError(.unsupportedLayer, "layer type '\(layer.typeName)' is not supported by Orchard", layer: layer.name)
            }
            blobToName[layer.output[0]] = name
            layers.append(spec)
        }
        for index in inputs.indices where categorical.contains(inputs[index].name) { inputs[index].categorical = true }

        let outputBlob = try outputBlob(description, network: network)
        guard let output = blobToName[outputBlob], layers.contains(where: { $0.name == output }) else {
            throw CoreMLError(.invalidModel, "the output '\(outputBlob)' is not produced by any layer")
        }

        var training: TrainingSpec?
        var ranges: CoreMLUpdateRanges?
        if updatable, let update = network.updateParams {
            (training, ranges) = try trainingSettings(update, outputBlob: outputBlob, blobToName: blobToName, output: output)
        }

        let metadata = description.metadata
        let name = metadata.userDefined[CoreMLExporter.modelNameKey] ?? options.defaultModelName
        let spec = ModelSpec(name: name, inputs: inputs, layers: layers, output: output, training: training)
        do { try spec.validate() } catch {
            throw CoreMLError(.invalidModel, "the imported architecture is not valid: \(error.message)")
        }
        return CoreMLImportedModel(
            spec: spec, weights: weights, classLabels: network.classLabels, ranges: ranges,
            metadata: CoreMLMetadata(
                shortDescription: metadata.shortDescription, author: metadata.author,
                license: metadata.license, version: metadata.versionString))
    }

    /// A multi-array feature's per-sample shape (see ``CoreMLShapes/perSample(_:exact:)``) and its declared rank.
    private func arrayShape(_ feature: ProtoFeature, role: String, exact: Bool) throws(CoreMLError) -> (shape: [Int], rank: Int) {
        guard case .multiArrayType(let array) = feature.type.type else {
            let type =
                feature.type.type.map { "\($0)".prefix { $0 != "(" } }.map(String.init)
                ?? UnknownFields.caseName(in: feature.type.unknownFields, table: CoreMLCaseNames.featureTypes) ?? "unknown"
            throw CoreMLError(.unsupportedFeature, "\(role) '\(feature.name)' is of type \(type); Orchard reads multi-array features")
        }
        let declared = array.shape.map { Int($0) }
        guard declared.allSatisfy({ $0 > 0 && $0 <= CoreMLShapes.maximumSize }), let shape = CoreMLShapes.perSample(declared, exact: exact) else {
            let forms = exact ? "[C], [1, C] or [1, C, H, W] (exact shape mapping: a leading batch axis of 1)" : "[C] or [C, H, W]"
            throw CoreMLError(.unsupportedFeature, "\(role) '\(feature.name)' has shape \(declared); Orchard reads \(forms) multi-arrays")
        }
        return (shape, declared.count)
    }

    private func outputBlob(_ description: CoreML_Specification_ModelDescription, network: CoreMLNetwork) throws(CoreMLError) -> String {
        if network.kind == "neuralNetworkClassifier" {
            if !network.labelProbabilityLayerName.isEmpty { return network.labelProbabilityLayerName }
            guard let last = network.layers.last?.output.first else { throw CoreMLError(.invalidModel, "the classifier has no layers") }
            return last
        }
        guard description.output.count == 1 else {
            throw CoreMLError(.unsupportedFeature, "the model has \(description.output.count) outputs; an Orchard model has one")
        }
        return description.output[0].name
    }

    private func record(_ name: String, _ shape: [Int], _ params: ProtoWeights, layer: ProtoLayer, role: String) throws(CoreMLError) -> TensorRecord {
        let values = try params.floats(layer: layer.name, role: role)
        guard let count = CoreMLShapes.elementCount(shape), values.count == count else {
            throw CoreMLError(
                .weightMismatch,
                "the \(role) has \(values.count) values; shape \(shape) needs \(CoreMLShapes.elementCount(shape).map(String.init) ?? "too many")",
                layer: layer.name)
        }
        return TensorRecord(name: name, shape: shape, values: values)
    }

    private func convolution(
        _ p: CoreML_Specification_ConvolutionLayerParams, into spec: inout LayerSpec, weights: inout [TensorRecord], layer: ProtoLayer, frozen: Bool
    ) throws(CoreMLError) {
        func unsupported(_ what: String) -> CoreMLError {
            CoreMLError(.unsupportedFeature, "convolution with \(what) is not supported by Orchard", layer: layer.name)
        }
        guard !p.isDeconvolution else { throw unsupported("deconvolution") }
        guard p.nGroups <= 1 else { throw unsupported("\(p.nGroups) groups") }
        guard p.dilationFactor.allSatisfy({ $0 == 1 }) else { throw unsupported("dilation \(p.dilationFactor)") }
        let kernel = p.kernelSize.isEmpty ? [3, 3] : p.kernelSize.map { Int($0) }
        let filters = Int(p.outputChannels)
        let channels = Int(p.kernelChannels)
        spec.type = .conv2d
        spec.units = filters
        spec.inChannels = channels
        spec.kernelSize = kernel
        spec.strides = p.stride.isEmpty ? [1, 1] : p.stride.map { Int($0) }
        spec.useBias = p.hasBias_p
        spec.frozen = frozen
        switch p.convolutionPaddingType {
        case .same(let same):
            guard same.asymmetryMode == .bottomRightHeavy else { throw unsupported("top-left-heavy same padding") }
            spec.padding = .same
        case .valid(let valid):
            spec.padding = try symmetricPadding(valid, layer: layer)
        case nil:
            spec.padding = .valid
        }
        weights.append(try record("\(spec.name).weight", [filters, channels] + kernel, p.weights, layer: layer, role: "weight"))
        if p.hasBias_p {
            weights.append(try record("\(spec.name).bias", [filters], p.bias, layer: layer, role: "bias"))
        }
    }

    private func pooling(_ p: CoreML_Specification_PoolingLayerParams, into spec: inout LayerSpec, layer: ProtoLayer, input: [Int]) throws(CoreMLError) {
        switch p.type {
        case .max:
            spec.type = .maxPool2d
        case .average:
            spec.type = .avgPool2d
        default:
            throw CoreMLError(
                .unsupportedLayer, "layer type '\(layer.typeName)' has no Orchard counterpart (Orchard pools with max or average)", layer: layer.name)
        }
        // Orchard's average leaves padded positions out; Core ML's counts them unless `avgPoolExcludePadding`.
        let padded: Bool
        switch p.poolingPaddingType {
        case .same: padded = true
        case .valid(let valid): padded = valid.paddingAmounts.borderAmounts.contains { $0.startEdgeSize > 0 || $0.endEdgeSize > 0 }
        case .includeLastPixel(let complete): padded = complete.paddingAmounts.contains { $0 > 0 }
        case nil: padded = false
        }
        if p.type == .average, padded, !p.avgPoolExcludePadding, !p.globalPooling {
            throw CoreMLError(
                .unsupportedFeature, "average pooling that counts padded zeros (avgPoolExcludePadding is false) is not supported by Orchard", layer: layer.name)
        }
        if p.globalPooling {
            // Global pooling is pooling with the whole image as the window.
            spec.kernelSize = [input[1], input[2]]
            spec.strides = [input[1], input[2]]
            spec.padding = .valid
            return
        }
        let kernel = p.kernelSize.isEmpty ? [3, 3] : p.kernelSize.map { Int($0) }
        let strides = p.stride.isEmpty ? [1, 1] : p.stride.map { Int($0) }
        spec.kernelSize = kernel
        spec.strides = strides
        switch p.poolingPaddingType {
        case .same(let same):
            guard same.asymmetryMode == .bottomRightHeavy else {
                throw CoreMLError(.unsupportedFeature, "top-left-heavy same padding is not supported by Orchard", layer: layer.name)
            }
            spec.padding = .same
        case .valid(let valid):
            spec.padding = try symmetricPadding(valid, layer: layer)
        case .includeLastPixel(let complete):
            // Equivalent to valid padding only when the windows tile the padded input exactly.
            let pads = complete.paddingAmounts.isEmpty ? [0, 0] : complete.paddingAmounts.map { Int(clamping: $0) }
            let exact = pads.count == 2 && (0..<2).allSatisfy { pads[$0] == 0 && (input[$0 + 1] - kernel[$0]) % strides[$0] == 0 }
            guard exact else {
                throw CoreMLError(.unsupportedFeature, "include-last-pixel pooling that adds a partial window is not supported by Orchard", layer: layer.name)
            }
            spec.padding = .valid
        case nil:
            spec.padding = .valid
        }
    }

    private func symmetricPadding(_ valid: CoreML_Specification_ValidPadding, layer: ProtoLayer) throws(CoreMLError) -> Padding {
        let borders = valid.paddingAmounts.borderAmounts
        if borders.isEmpty { return .valid }
        guard borders.count == 2, borders.allSatisfy({ $0.startEdgeSize == $0.endEdgeSize }) else {
            throw CoreMLError(
                .unsupportedFeature, "asymmetric padding \(borders.map { ($0.startEdgeSize, $0.endEdgeSize) }) is not supported by Orchard", layer: layer.name)
        }
        let (h, w) = (Int(borders[0].startEdgeSize), Int(borders[1].startEdgeSize))
        return h == 0 && w == 0 ? .valid : .explicit(height: h, width: w)
    }

    private func trainingSettings(_ update: ProtoUpdateParameters, outputBlob: String, blobToName: [String: String], output: String) throws(CoreMLError) -> (
        TrainingSpec, CoreMLUpdateRanges
    ) {
        let loss = update.lossLayers[0]
        let (input, _) = try CoreMLUpdateRules.lossEndpoints(loss)
        guard blobToName[input] == output else {
            throw CoreMLError(
                .unsupportedFeature, "the loss reads '\(input)', not the model output '\(outputBlob)'; Orchard trains against its output", layer: loss.name)
        }
        let lossType: LossType
        if case .categoricalCrossEntropyLossLayer = loss.lossLayerType { lossType = .crossEntropy } else { lossType = .meanSquaredError }

        var ranges = CoreMLUpdateRanges()
        func range(_ p: CoreML_Specification_DoubleParameter, default fallback: ClosedRange<Double>) -> ClosedRange<Double> {
            if case .range(let r) = p.allowedValues, r.minValue <= r.maxValue { return r.minValue...r.maxValue }
            return fallback
        }
        func allowed(_ p: CoreML_Specification_Int64Parameter) -> CoreMLAllowedIntegers? {
            switch p.allowedValues {
            case .set(let s): .set(s.values.map { Int($0) })
            case .range(let r): r.minValue <= r.maxValue ? .range(Int(r.minValue)...Int(r.maxValue)) : nil
            case nil: nil
            }
        }
        let optimizer: OptimizerSpec
        let batchSize: Int
        switch update.optimizer.optimizerType {
        case .sgdOptimizer(let o):
            optimizer = .sgd(learningRate: o.learningRate.defaultValue, momentum: o.momentum.defaultValue)
            ranges.learningRate = range(o.learningRate, default: ranges.learningRate)
            ranges.momentum = range(o.momentum, default: ranges.momentum)
            ranges.miniBatchSizes = allowed(o.miniBatchSize)
            batchSize = Int(o.miniBatchSize.defaultValue)
        case .adamOptimizer(let o):
            optimizer = .adam(learningRate: o.learningRate.defaultValue, beta1: o.beta1.defaultValue, beta2: o.beta2.defaultValue, epsilon: o.eps.defaultValue)
            ranges.learningRate = range(o.learningRate, default: ranges.learningRate)
            ranges.beta1 = range(o.beta1, default: ranges.beta1)
            ranges.beta2 = range(o.beta2, default: ranges.beta2)
            ranges.epsilon = range(o.eps, default: ranges.epsilon)
            ranges.miniBatchSizes = allowed(o.miniBatchSize)
            batchSize = Int(o.miniBatchSize.defaultValue)
        case nil:
            throw CoreMLError(.unsupportedFeature, "the model has no supported optimizer")
        }
        ranges.epochs = allowed(update.epochs)
        let training = TrainingSpec(loss: lossType, optimizer: optimizer, epochs: Int(update.epochs.defaultValue), batchSize: batchSize)
        return (training, ranges)
    }
}

/// Hands out unique Orchard names (no dots, distinct from inputs and earlier layers) for Core ML layer names.
private struct Names {
    var taken: Set<String>

    mutating func make(from coreMLName: String) -> String {
        var base = String(coreMLName.map { $0 == "." ? "_" : $0 })
        if base.isEmpty { base = "layer" }
        var name = base
        var suffix = 2
        while taken.contains(name) {
            name = "\(base)_\(suffix)"
            suffix += 1
        }
        taken.insert(name)
        return name
    }
}
