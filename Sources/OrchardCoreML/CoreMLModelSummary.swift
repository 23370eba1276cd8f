import Foundation

/// What a Core ML neural-network file contains: features, layers with shapes and updatable flags, and the
/// update parameters. Reads layers of every type, including those Orchard cannot import.
public struct CoreMLModelSummary: Sendable, Hashable, CustomStringConvertible {
    /// One model input, output or training input.
    public struct Feature: Sendable, Hashable {
        /// The feature's name.
        public var name: String
        /// Its type, e.g. `MultiArray<Double> [10]` or `Int64`.
        public var type: String
    }

    /// One layer.
    public struct Layer: Sendable, Hashable {
        /// The layer's name.
        public var name: String
        /// Its Core ML type, e.g. `innerProduct` or `activation.ReLU`.
        public var type: String
        /// The blobs it reads.
        public var inputs: [String]
        /// The blobs it writes.
        public var outputs: [String]
        /// The per-sample shape of its first output, when it can be computed.
        public var outputShape: [Int]?
        /// Whether the layer is updated on the device.
        public var isUpdatable: Bool
        /// The number of weight and bias values it stores.
        public var parameterCount: Int
    }

    /// The Core ML specification version.
    public var specificationVersion: Int
    /// `neuralNetwork`, `neuralNetworkClassifier` or `neuralNetworkRegressor`.
    public var modelType: String
    /// Whether the model can be updated on the device.
    public var isUpdatable: Bool
    /// Whether multi-array inputs use exact shape mapping (specification 4+) rather than rank-5 mapping.
    public var exactShapeMapping: Bool = false
    /// The prediction inputs.
    public var inputs: [Feature]
    /// The prediction outputs.
    public var outputs: [Feature]
    /// The inputs an update needs (the prediction inputs and the loss target).
    public var trainingInputs: [Feature]
    /// The layers, in order.
    public var layers: [Layer]
    /// A classifier's number of class labels.
    public var classLabelCount: Int
    /// The loss, e.g. `meanSquaredError(input: out, target: out_true)`.
    public var loss: String?
    /// The optimizer and its parameters with their allowed values.
    public var optimizer: String?
    /// The epochs and their allowed values.
    public var epochs: String?
    /// Whether training data is shuffled each epoch.
    public var shuffle: Bool?
    /// The violation of Core ML's updatable-model rules, if the file breaks one.
    public var ruleViolation: String?

    /// Reads a summary from `.mlmodel` bytes.
    /// - Throws: ``CoreMLError`` when the bytes are not a Core ML neural network.
    public init(bytes: [UInt8]) throws(CoreMLError) {
        let model = try CoreMLCoding.decode(bytes)
        let network = try CoreMLNetwork(model)
        let description = model.description_p
        specificationVersion = Int(model.specificationVersion)
        modelType = network.kind
        isUpdatable = model.isUpdatable
        inputs = description.input.map(Self.feature)
        outputs = description.output.map(Self.feature)
        trainingInputs = description.trainingInput.map(Self.feature)
        classLabelCount = network.classLabels.count

        var inputShapes: [String: [Int]] = [:]
        var inputRanks: [String: Int] = [:]
        let exact = network.shapeMapping == .exactArrayMapping
        exactShapeMapping = exact
        for feature in description.input {
            if case .multiArrayType(let array) = feature.type.type, array.shape.allSatisfy({ $0 > 0 && $0 <= CoreMLShapes.maximumSize }) {
                let declared = array.shape.map { Int($0) }
                inputShapes[feature.name] = CoreMLShapes.perSample(declared, exact: exact) ?? declared
                inputRanks[feature.name] = declared.count
            }
        }
        let shapes =
            (try? exact
                ? CoreMLShapes.exactBlobShapes(inputs: inputShapes, ranks: inputRanks, layers: network.layers, lenient: true)
                : CoreMLShapes.blobShapes(inputs: inputShapes, layers: network.layers, lenient: true)) ?? inputShapes
        layers = network.layers.map { layer in
            Layer(
                name: layer.name, type: layer.typeName, inputs: layer.input, outputs: layer.output,
                outputShape: layer.output.first.flatMap { shapes[$0] }, isUpdatable: layer.isUpdatable,
                parameterCount: layer.weightParams.reduce(0) { $0 + Self.count($1.params) })
        }

        if let update = network.updateParams {
            if let first = update.lossLayers.first {
                switch first.lossLayerType {
                case .meanSquaredErrorLossLayer(let l): loss = "meanSquaredError(input: \(l.input), target: \(l.target))"
                case .categoricalCrossEntropyLossLayer(let l): loss = "categoricalCrossEntropy(input: \(l.input), target: \(l.target))"
                case nil: loss = UnknownFields.caseName(in: first.unknownFields, table: CoreMLCaseNames.lossTypes) ?? "unknown"
                }
                if update.lossLayers.count > 1 { loss! += " and \(update.lossLayers.count - 1) more" }
            }
            switch update.optimizer.optimizerType {
            case .sgdOptimizer(let o):
                optimizer =
                    "SGD(learningRate: \(Self.double(o.learningRate)), miniBatchSize: \(Self.integer(o.miniBatchSize)), momentum: \(Self.double(o.momentum)))"
            case .adamOptimizer(let o):
                optimizer =
                    "Adam(learningRate: \(Self.double(o.learningRate)), miniBatchSize: \(Self.integer(o.miniBatchSize)), beta1: \(Self.double(o.beta1)), beta2: \(Self.double(o.beta2)), eps: \(Self.double(o.eps)))"
            case nil:
                optimizer =
                    update.hasOptimizer ? UnknownFields.caseName(in: update.optimizer.unknownFields, table: CoreMLCaseNames.optimizerTypes) ?? "unknown" : nil
            }
            epochs = update.hasEpochs ? Self.integer(update.epochs) : nil
            shuffle = update.hasShuffle ? update.shuffle.defaultValue : nil
        }
        do { try CoreMLUpdateRules.check(model, network: network) } catch { ruleViolation = error.description }
    }

    /// A human-readable report.
    public var description: String {
        var lines = [
            "\(modelType), specification version \(specificationVersion), \(isUpdatable ? "updatable" : "not updatable")"
                + (exactShapeMapping ? ", exact shape mapping" : "")
        ]
        func features(_ title: String, _ list: [Feature]) {
            guard !list.isEmpty else { return }
            lines.append("\(title):")
            lines += list.map { "  \($0.name): \($0.type)" }
        }
        features("inputs", inputs)
        features("outputs", outputs)
        features("training inputs", trainingInputs)
        if classLabelCount > 0 { lines.append("class labels: \(classLabelCount)") }
        lines.append("layers:")
        let rows = layers.map { layer -> [String] in
            [
                layer.name, layer.type, layer.inputs.joined(separator: ", ") + " -> " + layer.outputs.joined(separator: ", "),
                layer.outputShape.map { "\($0)" } ?? "?", layer.parameterCount > 0 ? "\(layer.parameterCount) params" : "",
                layer.isUpdatable ? "updatable" : "",
            ]
        }
        let widths = (0..<6).map { column in rows.map { $0[column].count }.max() ?? 0 }
        for row in rows {
            let padded = zip(row, widths).map { $0.padding(toLength: $1, withPad: " ", startingAt: 0) }
            lines.append("  " + padded.joined(separator: "  ").trimmingCharacters(in: .whitespaces))
        }
        if let loss { lines.append("loss: \(loss)") }
        if let optimizer { lines.append("optimizer: \(optimizer)") }
        if let epochs { lines.append("epochs: \(epochs)") }
        if let shuffle { lines.append("shuffle: \(shuffle)") }
        if let ruleViolation { lines.append("Core ML update rules: VIOLATED: \(ruleViolation)") }
        return lines.joined(separator: "\n")
    }

    private static func feature(_ feature: ProtoFeature) -> Feature {
        let type: String
        switch feature.type.type {
        case .multiArrayType(let array):
            let element: String
            switch array.dataType {
            case .double: element = "Double"
            case .float32: element = "Float32"
            case .float16: element = "Float16"
            case .int32: element = "Int32"
            case .int8: element = "Int8"
            default: element = "?"
            }
            type = "MultiArray<\(element)> \(array.shape)"
        case .int64Type: type = "Int64"
        case .doubleType: type = "Double"
        case .stringType: type = "String"
        case .dictionaryType(let d):
            if case .int64KeyType = d.keyType { type = "Dictionary<Int64, Double>" } else { type = "Dictionary<String, Double>" }
        case nil:
            type = UnknownFields.caseName(in: feature.type.unknownFields, table: CoreMLCaseNames.featureTypes) ?? "unknown"
        }
        return Feature(name: feature.name, type: type)
    }

    private static func count(_ params: ProtoWeights) -> Int {
        if !params.floatValue.isEmpty { return params.floatValue.count }
        if !params.float16Value.isEmpty { return params.float16Value.count / 2 }
        return params.int8RawValue.count
    }

    private static func double(_ p: CoreML_Specification_DoubleParameter) -> String {
        if case .range(let r) = p.allowedValues { return "\(p.defaultValue) in [\(r.minValue), \(r.maxValue)]" }
        return "\(p.defaultValue)"
    }

    private static func integer(_ p: CoreML_Specification_Int64Parameter) -> String {
        switch p.allowedValues {
        case .set(let s): "\(p.defaultValue) in {\(s.values.map(String.init).joined(separator: ", "))}"
        case .range(let r): "\(p.defaultValue) in [\(r.minValue), \(r.maxValue)]"
        case nil: "\(p.defaultValue)"
        }
    }
}
