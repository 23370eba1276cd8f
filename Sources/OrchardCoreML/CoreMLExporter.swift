public import OrchardFormats

/// Writes an Orchard model (architecture and weights) as a Core ML neural network, updatable on the device
/// with `MLUpdateTask` when the spec carries its training settings.
///
/// The file is specification version 4 (iOS 13, macOS 10.15) with rank-5 array mapping, as coremltools'
/// `NeuralNetworkBuilder` writes it: a vector input of size n is a multi-array of shape `[n]`, an image-like input
/// a multi-array `[C, H, W]`. Every layer keeps its Orchard name, and its output blob is named after it.
/// Exporting the same model twice gives identical bytes.
public struct CoreMLExporter: Sendable {
    /// The export settings.
    public var options: CoreMLExportOptions

    /// The specification version written: the first with updatable models.
    public static let specificationVersion: Int32 = 4
    /// The metadata key that stores the Orchard model's name.
    public static let modelNameKey = "orchard.modelName"

    /// Creates an exporter.
    public init(options: CoreMLExportOptions = CoreMLExportOptions()) {
        self.options = options
    }

    /// Encodes `spec` with `weights` as `.mlmodel` bytes.
    /// - Parameters:
    ///   - spec: The architecture; with ``CoreMLExportOptions/updatable`` it must have `training`.
    ///   - weights: One tensor per parameter, named `<layer>.weight` / `<layer>.bias` in Orchard's layouts.
    /// - Throws: ``CoreMLError`` naming the layer when the model cannot be expressed in Core ML or breaks
    ///   Core ML's rules for updatable models.
    public func export(_ spec: ModelSpec, weights: [TensorRecord]) throws(CoreMLError) -> [UInt8] {
        try CoreMLCoding.encode(makeModel(spec, weights: weights))
    }

    func makeModel(_ spec: ModelSpec, weights: [TensorRecord]) throws(CoreMLError) -> ProtoModel {
        do { try spec.validate() } catch { throw CoreMLError(.invalidModel, error.message) }
        // An updatable model carries its training settings to the device: held to the limits a hosted model's are (a
        // β of 1 or an ε of 0 would pass Core ML's own range checks and make the device's weights infinite).
        if options.updatable, spec.training != nil {
            do { try spec.validateLimits() } catch { throw CoreMLError(.invalidModel, error.message) }
        }
        if let recurrent = spec.layers.first(where: { LayerType.recurrent.contains($0.type) }) {
            throw CoreMLError(
                .unsupportedLayer,
                "Orchard layer type '\(recurrent.type)' cannot be trained by Core ML (an updatable model trains only its dense and convolution layers, and one containing an LSTM fails to update: coremltools issue 2074); devices train it with the Orchard engine",
                layer: recurrent.name)
        }
        if let sequence = spec.layers.first(where: { [LayerType.conv1d, .maxPool1d, .avgPool1d].contains($0.type) }) {
            throw CoreMLError(
                .unsupportedLayer,
                "Orchard layer type '\(sequence.type)' has no Core ML counterpart an updatable model can train (Core ML trains dense and 2-D convolution layers over [C, H, W]); devices train it with the Orchard engine",
                layer: sequence.name)
        }
        if let reshape = spec.layers.first(where: { $0.type == .reshape }) {
            throw CoreMLError(
                .unsupportedLayer, "Orchard layer type 'reshape' is not exported to Core ML (it feeds sequence layers, which Core ML cannot train)",
                layer: reshape.name)
        }
        let layerShapes: [String: [Int]]
        do { layerShapes = try spec.layerShapes() } catch { throw CoreMLError(.invalidModel, error.message) }
        if let dense = spec.layers.first(where: { $0.type == .dense && (layerShapes[$0.inputs.first ?? ""]?.count ?? 1) > 1 }) {
            throw CoreMLError(
                .unsupportedLayer,
                "dense layer '\(dense.name)' reads a \(layerShapes[dense.inputs[0]] ?? []) input over its last axis; Core ML's inner product takes a flat input (add a flatten layer before it)",
                layer: dense.name)
        }
        var store = try WeightStore(weights)

        var model = ProtoModel()
        model.specificationVersion = Self.specificationVersion
        var inputShapes: [String: [Int]] = [:]
        for input in spec.inputs {
            guard input.shape.count == 1 || input.shape.count == 3 else {
                throw CoreMLError(.unsupportedFeature, "input '\(input.name)' has shape \(input.shape); Core ML neural networks take [n] or [C, H, W]")
            }
            inputShapes[input.name] = input.shape
            model.description_p.input.append(
                feature(
                    input.name, shape: input.shape, dataType: options.arrayDataType.proto,
                    note: input.categorical ? "category index" : ""))
        }

        var alias: [String: String] = [:]
        var layers: [ProtoLayer] = []
        var trainable: [String: Bool] = [:]
        for layer in spec.layers {
            let inputs = layer.inputs.map { alias[$0] ?? $0 }
            if layer.type == .dropout {
                guard options.dropout.omits else {
                    throw CoreMLError(
                        .unsupportedLayer, "Core ML neural networks have no dropout; export with dropout handling 'omit' to leave it out", layer: layer.name)
                }
                alias[layer.name] = inputs[0]
                continue
            }
            var proto = try makeLayer(layer, store: &store)
            proto.name = layer.name
            proto.input = inputs
            proto.output = [layer.name]
            layers.append(proto)
            trainable[layer.name] = !layer.frozen
        }
        try store.checkAllUsed()

        let shapes = try CoreMLShapes.blobShapes(inputs: inputShapes, layers: layers, lenient: false)
        try checkOrchardSemantics(layers, shapes: shapes)
        let output = alias[spec.output] ?? spec.output
        guard let outputShape = shapes[output] else {
            throw CoreMLError(.invalidModel, "the output '\(spec.output)' has no computable shape")
        }
        model.description_p.output = [feature(output, shape: outputShape, dataType: options.arrayDataType.proto, note: "")]

        var network = CoreML_Specification_NeuralNetwork()
        if options.updatable {
            guard let training = spec.training else {
                throw CoreMLError(
                    .invalidModel,
                    "an updatable export needs the model's training settings (loss, optimizer, epochs); export with updatable: false for a prediction-only model"
                )
            }
            for index in layers.indices where trainable[layers[index].name] == true {
                try markUpdatable(&layers[index])
            }
            network.updateParams = try updateParameters(training, output: output, layerNames: Set(layers.map(\.name)))
            let target = try CoreMLUpdateRules.lossEndpoints(network.updateParams.lossLayers[0]).target
            guard inputShapes[target] == nil else {
                throw CoreMLError(.invalidModel, "the loss target name '\(target)' is already a model input")
            }
            let targetFeature =
                training.loss == .crossEntropy
                ? feature(target, shape: [1], dataType: .int32, note: "class index")
                : feature(target, shape: outputShape, dataType: options.arrayDataType.proto, note: "")
            model.description_p.trainingInput = model.description_p.input + [targetFeature]
            model.isUpdatable = true
        }
        network.layers = layers
        network.arrayInputShapeMapping = .rank5ArrayMapping
        model.neuralNetwork = network

        var metadata = CoreML_Specification_Metadata()
        metadata.shortDescription = options.metadata.shortDescription
        metadata.author = options.metadata.author
        metadata.license = options.metadata.license
        metadata.versionString = options.metadata.version
        metadata.userDefined = [Self.modelNameKey: spec.name]
        model.description_p.metadata = metadata

        try CoreMLUpdateRules.check(model, network: CoreMLNetwork(model))
        return model
    }

    private func feature(_ name: String, shape: [Int], dataType: CoreML_Specification_ArrayFeatureType.ArrayDataType, note: String) -> ProtoFeature {
        var feature = ProtoFeature()
        feature.name = name
        feature.shortDescription = note
        var array = CoreML_Specification_ArrayFeatureType()
        array.shape = shape.map { Int64($0) }
        array.dataType = dataType
        feature.type.multiArrayType = array
        return feature
    }

    private func makeLayer(_ layer: LayerSpec, store: inout WeightStore) throws(CoreMLError) -> ProtoLayer {
        var proto = ProtoLayer()
        let name = layer.name
        switch layer.type {
        case .dense:
            let weight = try store.take("\(name).weight", rank: 2, layer: name)
            let (units, inputs) = (weight.shape[0], weight.shape[1])
            try expect(layer.units, units, "units", layer: name)
            try expect(layer.inputSize, inputs, "inputSize", layer: name)
            var p = CoreML_Specification_InnerProductLayerParams()
            p.inputChannels = UInt64(inputs)
            p.outputChannels = UInt64(units)
            p.weights.floatValue = weight.values
            if layer.useBias ?? true {
                p.hasBias_p = true
                p.bias.floatValue = try store.take("\(name).bias", shape: [units], layer: name).values
            }
            proto.innerProduct = p
        case .embedding:
            let weight = try store.take("\(name).weight", rank: 2, layer: name)
            let (vocabulary, width) = (weight.shape[0], weight.shape[1])
            try expect(layer.vocabularySize, vocabulary, "vocabularySize", layer: name)
            try expect(layer.embeddingSize, width, "embeddingSize", layer: name)
            var p = CoreML_Specification_EmbeddingLayerParams()
            p.inputDim = UInt64(vocabulary)
            p.outputChannels = UInt64(width)
            // Core ML stores the table as outputChannels × inputDim, Orchard as vocabulary × width.
            p.weights.floatValue = transpose(weight.values, rows: vocabulary, columns: width)
            proto.embedding = p
        case .relu:
            proto.activation.reLu = CoreML_Specification_ActivationReLU()
        case .sigmoid:
            proto.activation.sigmoid = CoreML_Specification_ActivationSigmoid()
        case .tanh:
            proto.activation.tanh = CoreML_Specification_ActivationTanh()
        case .softmax:
            proto.softmax = CoreML_Specification_SoftmaxLayerParams()
        case .flatten:
            var p = CoreML_Specification_FlattenLayerParams()
            p.mode = .channelFirst
            proto.flatten = p
        case .concat:
            proto.concat = CoreML_Specification_ConcatLayerParams()
        case .conv2d:
            let weight = try store.take("\(name).weight", rank: 4, layer: name)
            let filters = weight.shape[0]
            try expect(layer.units, filters, "units", layer: name)
            try expect(layer.inChannels, weight.shape[1], "inChannels", layer: name)
            if let kernel = layer.kernelSize, kernel != Array(weight.shape[2...]) {
                throw CoreMLError(.weightMismatch, "kernelSize \(kernel) does not match the weight's \(Array(weight.shape[2...]))", layer: name)
            }
            var p = CoreML_Specification_ConvolutionLayerParams()
            p.outputChannels = UInt64(filters)
            p.kernelChannels = UInt64(weight.shape[1])
            p.nGroups = 1
            p.kernelSize = weight.shape[2...].map { UInt64($0) }
            p.stride = try pair(layer.strides ?? [1, 1], "strides", layer: name)
            p.dilationFactor = [1, 1]
            switch try padding(layer.padding ?? .valid) {
            case .same(let same): p.same = same
            case .valid(let valid): p.valid = valid
            }
            p.weights.floatValue = weight.values
            if layer.useBias ?? true {
                p.hasBias_p = true
                p.bias.floatValue = try store.take("\(name).bias", shape: [filters], layer: name).values
            }
            proto.convolution = p
        case .maxPool2d, .avgPool2d:
            guard let kernel = layer.kernelSize else {
                throw CoreMLError(.invalidModel, "pooling needs kernelSize", layer: name)
            }
            var p = CoreML_Specification_PoolingLayerParams()
            // Orchard's average leaves padded positions out, as `avgPoolExcludePadding` does.
            p.type = layer.type == .maxPool2d ? .max : .average
            p.kernelSize = try pair(kernel, "kernelSize", layer: name)
            p.stride = try pair(layer.strides ?? kernel, "strides", layer: name)
            p.avgPoolExcludePadding = true
            switch try padding(layer.padding ?? .valid) {
            case .same(let same): p.same = same
            case .valid(let valid): p.valid = valid
            }
            proto.pooling = p
        default:
            throw CoreMLError(.unsupportedLayer, "Orchard layer type '\(layer.type)' has no Core ML counterpart", layer: name)
        }
        return proto
    }

    private enum PaddingChoice {
        case same(CoreML_Specification_SamePadding)
        case valid(CoreML_Specification_ValidPadding)
    }

    /// Orchard's "same" is TensorFlow's rule (extra row and column after), which is Core ML's bottom-right-heavy
    /// same padding; explicit padding is Core ML's valid padding with border amounts.
    private func padding(_ padding: Padding) throws(CoreMLError) -> PaddingChoice {
        if padding.isSame {
            var same = CoreML_Specification_SamePadding()
            same.asymmetryMode = .bottomRightHeavy
            return .same(same)
        }
        let (h, w) = padding.explicitAmounts ?? (0, 0)
        var valid = CoreML_Specification_ValidPadding()
        for amount in [h, w] {
            var edge = CoreML_Specification_BorderAmounts.EdgeSizes()
            edge.startEdgeSize = UInt64(amount)
            edge.endEdgeSize = UInt64(amount)
            valid.paddingAmounts.borderAmounts.append(edge)
        }
        return .valid(valid)
    }

    /// Rejects layers whose Core ML meaning differs from Orchard's for the shapes they receive.
    private func checkOrchardSemantics(_ layers: [ProtoLayer], shapes: [String: [Int]]) throws(CoreMLError) {
        for layer in layers {
            let inputs = layer.input.compactMap { shapes[$0] }
            switch layer.layer {
            case .concat where inputs.contains { $0.count != 1 }:
                throw CoreMLError(
                    .unsupportedLayer, "concat of [C, H, W] inputs: Core ML joins channels, Orchard the last axis; flatten the inputs first", layer: layer.name)
            case .softmax where inputs.contains { $0.count != 1 }:
                throw CoreMLError(
                    .unsupportedLayer, "softmax of a [C, H, W] input: Core ML normalizes channels, Orchard the last axis; flatten first", layer: layer.name)
            case .embedding where inputs.contains { $0 != [1] }:
                throw CoreMLError(.unsupportedLayer, "embedding input must have shape [1] (one category index), not \(inputs.first ?? [])", layer: layer.name)
            default: break
            }
        }
    }

    private func markUpdatable(_ layer: inout ProtoLayer) throws(CoreMLError) {
        switch layer.layer {
        case .innerProduct(var p):
            p.weights.isUpdatable = true
            if p.hasBias_p { p.bias.isUpdatable = true }
            layer.innerProduct = p
        case .convolution(var p):
            p.weights.isUpdatable = true
            if p.hasBias_p { p.bias.isUpdatable = true }
            layer.convolution = p
        case .embedding:
            throw CoreMLError(
                .updateRules,
                "the embedding is trainable, but Core ML updates only inner-product and convolution layers; freeze it (frozen: true) to export it as a fixed table",
                layer: layer.name)
        default:
            return
        }
        layer.isUpdatable = true
    }

    private func updateParameters(_ training: TrainingSpec, output: String, layerNames: Set<String>) throws(CoreMLError) -> ProtoUpdateParameters {
        var update = ProtoUpdateParameters()
        var loss = CoreML_Specification_LossLayer()
        var lossName = "\(output)_loss"
        var suffix = 2
        while layerNames.contains(lossName) {
            lossName = "\(output)_loss\(suffix)"
            suffix += 1
        }
        loss.name = lossName
        let target = "\(output)_true"
        guard !layerNames.contains(target) else {
            throw CoreMLError(.invalidModel, "the loss target name '\(target)' is already a layer name", layer: target)
        }
        switch training.loss {
        case .meanSquaredError:
            var mse = CoreML_Specification_MeanSquaredErrorLossLayer()
            mse.input = output
            mse.target = target
            loss.meanSquaredErrorLossLayer = mse
        case .crossEntropy:
            var cce = CoreML_Specification_CategoricalCrossEntropyLossLayer()
            cce.input = output
            cce.target = target
            loss.categoricalCrossEntropyLossLayer = cce
        default:
            throw CoreMLError(.unsupportedFeature, "loss '\(training.loss)' has no Core ML counterpart; Core ML updates with mse or crossEntropy")
        }
        update.lossLayers = [loss]

        let optimizer = training.optimizer
        if !options.dropsUnrepresentableTrainingSettings {
            if optimizer.weightDecay != 0 {
                throw CoreMLError(
                    .unsupportedFeature,
                    "Core ML optimizers have no weight decay (the spec asks for \(optimizer.weightDecay)); set it to 0 or allow dropping unrepresentable training settings"
                )
            }
            if let cap = training.maxUpdates {
                throw CoreMLError(
                    .unsupportedFeature,
                    "Core ML has no update cap (the spec asks for at most \(cap) updates); remove it or allow dropping unrepresentable training settings")
            }
        }
        let ranges = options.ranges
        let batch = try integer(training.batchSize, allowed: ranges.miniBatchSizes, "batch size")
        switch optimizer.type {
        case "sgd":
            var sgd = CoreML_Specification_SGDOptimizer()
            sgd.learningRate = try double(optimizer.learningRate, range: ranges.learningRate, "learning rate")
            sgd.miniBatchSize = batch
            sgd.momentum = try double(optimizer.momentum, range: ranges.momentum, "momentum")
            update.optimizer.sgdOptimizer = sgd
        case "adam":
            var adam = CoreML_Specification_AdamOptimizer()
            adam.learningRate = try double(optimizer.learningRate, range: ranges.learningRate, "learning rate")
            adam.miniBatchSize = batch
            adam.beta1 = try double(optimizer.beta1, range: ranges.beta1, "beta1")
            adam.beta2 = try double(optimizer.beta2, range: ranges.beta2, "beta2")
            adam.eps = try double(optimizer.epsilon, range: ranges.epsilon, "epsilon")
            update.optimizer.adamOptimizer = adam
        default:
            throw CoreMLError(.unsupportedFeature, "optimizer '\(optimizer.type)' has no Core ML counterpart; Core ML updates with sgd or adam")
        }
        update.epochs = try integer(training.epochs, allowed: ranges.epochs, "epochs")
        var shuffle = CoreML_Specification_BoolParameter()
        shuffle.defaultValue = options.shuffle
        update.shuffle = shuffle
        return update
    }

    private func double(_ value: Double, range: ClosedRange<Double>, _ name: String) throws(CoreMLError) -> CoreML_Specification_DoubleParameter {
        guard range.contains(value) else {
            throw CoreMLError(.unsupportedFeature, "\(name) \(value) is outside its allowed range [\(range.lowerBound), \(range.upperBound)]")
        }
        var p = CoreML_Specification_DoubleParameter()
        p.defaultValue = value
        var r = CoreML_Specification_DoubleRange()
        r.minValue = range.lowerBound
        r.maxValue = range.upperBound
        p.range = r
        return p
    }

    private func integer(_ value: Int, allowed: CoreMLAllowedIntegers?, _ name: String) throws(CoreMLError) -> CoreML_Specification_Int64Parameter {
        guard value > 0 else { throw CoreMLError(.invalidModel, "\(name) must be positive, not \(value)") }
        let allowed = allowed ?? .set([value])
        guard allowed.contains(value) else {
            throw CoreMLError(.unsupportedFeature, "\(name) \(value) is not among the allowed values \(allowed)")
        }
        var p = CoreML_Specification_Int64Parameter()
        p.defaultValue = Int64(value)
        if let values = allowed.values {
            var s = CoreML_Specification_Int64Set()
            s.values = values.map { Int64($0) }
            p.set = s
        } else if let range = allowed.range {
            var r = CoreML_Specification_Int64Range()
            r.minValue = Int64(range.lowerBound)
            r.maxValue = Int64(range.upperBound)
            p.range = r
        }
        return p
    }

    private func expect(_ declared: Int?, _ actual: Int, _ attribute: String, layer: String) throws(CoreMLError) {
        if let declared, declared != actual {
            throw CoreMLError(.weightMismatch, "\(attribute) is \(declared) but the weight says \(actual)", layer: layer)
        }
    }

    private func pair(_ values: [Int], _ name: String, layer: String) throws(CoreMLError) -> [UInt64] {
        guard values.count == 2, values.allSatisfy({ $0 > 0 }) else {
            throw CoreMLError(.invalidModel, "\(name) must be two positive numbers, not \(values)", layer: layer)
        }
        return values.map { UInt64($0) }
    }
}

/// Transposes a row-major `rows × columns` matrix.
func transpose(_ values: [Float], rows: Int, columns: Int) -> [Float] {
    var out = [Float](repeating: 0, count: values.count)
    for r in 0..<rows {
        for c in 0..<columns { out[c * rows + r] = values[r * columns + c] }
    }
    return out
}

/// The weights of a model by name, tracking which ones the layers used.
struct WeightStore {
    private var tensors: [String: TensorRecord] = [:]
    private var used = Set<String>()

    init(_ records: [TensorRecord]) throws(CoreMLError) {
        for record in records {
            guard tensors.updateValue(record, forKey: record.name) == nil else {
                throw CoreMLError(.weightMismatch, "tensor '\(record.name)' appears twice")
            }
        }
    }

    mutating func take(_ name: String, rank: Int, layer: String) throws(CoreMLError) -> TensorRecord {
        guard let tensor = tensors[name] else {
            throw CoreMLError(.weightMismatch, "the weights have no tensor '\(name)'", layer: layer)
        }
        guard tensor.shape.count == rank, tensor.shape.allSatisfy({ $0 > 0 }) else {
            throw CoreMLError(.weightMismatch, "'\(name)' has shape \(tensor.shape); expected \(rank) positive dimensions", layer: layer)
        }
        used.insert(name)
        return tensor
    }

    mutating func take(_ name: String, shape: [Int], layer: String) throws(CoreMLError) -> TensorRecord {
        let tensor = try take(name, rank: shape.count, layer: layer)
        guard tensor.shape == shape else {
            throw CoreMLError(.weightMismatch, "'\(name)' has shape \(tensor.shape); expected \(shape)", layer: layer)
        }
        return tensor
    }

    func checkAllUsed() throws(CoreMLError) {
        if let extra = tensors.keys.sorted().first(where: { !used.contains($0) }) {
            throw CoreMLError(.weightMismatch, "tensor '\(extra)' belongs to no layer of the model")
        }
    }
}
