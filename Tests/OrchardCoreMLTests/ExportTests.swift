import Foundation
import OrchardFormats
import SwiftProtobuf
import Testing

@testable import OrchardCoreML

@Suite struct ExportTests {
    private func export(_ spec: ModelSpec, options: CoreMLExportOptions = CoreMLExportOptions(), weights: [TensorRecord]? = nil) throws
        -> CoreML_Specification_Model
    {
        let bytes = try CoreMLExporter(options: options).export(spec, weights: weights ?? Models.weights(for: spec))
        return try CoreML_Specification_Model(serializedBytes: bytes)
    }

    private func expectError(
        _ code: CoreMLError.Code, layer: String?, containing text: String,
        _ body: () throws -> Void, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        do {
            try body()
            Issue.record("expected a \(code) error", sourceLocation: sourceLocation)
        } catch let error as CoreMLError {
            #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
            #expect(error.layer == layer, "\(error)", sourceLocation: sourceLocation)
            #expect(error.message.contains(text), "\(error)", sourceLocation: sourceLocation)
        } catch {
            Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
        }
    }

    @Test func housingModelExportsAsUpdatableNetwork() throws {
        let spec = Models.housing()
        let weights = Models.weights(for: spec)
        let model = try export(spec, weights: weights)
        #expect(model.specificationVersion == 4)
        #expect(model.isUpdatable)
        let network = model.neuralNetwork
        #expect(network.layers.map(\.name) == spec.layers.map(\.name))
        #expect(
            network.layers.map(\.typeName) == [
                "embedding", "embedding", "concat", "innerProduct", "activation.ReLU", "innerProduct", "activation.ReLU", "innerProduct",
            ])
        #expect(network.layers.filter(\.isUpdatable).map(\.name) == ["dense1", "dense2", "out"])
        for layer in network.layers where layer.isUpdatable {
            #expect(layer.innerProduct.weights.isUpdatable && layer.innerProduct.bias.isUpdatable)
        }
        // Embedding tables are stored transposed: Core ML's outputChannels × inputDim.
        let rad = network.layers[1].embedding
        let radWeight = try #require(weights.first { $0.name == "radEmbedding.weight" })
        #expect(rad.inputDim == 9 && rad.outputChannels == 4)
        #expect(rad.weights.floatValue[1 * 9 + 7] == radWeight.values[7 * 4 + 1])
        #expect(network.layers[3].innerProduct.weights.floatValue == weights.first { $0.name == "dense1.weight" }!.values)

        let description = model.description_p
        #expect(description.input.map(\.name) == ["numeric", "chas", "rad"])
        #expect(description.input.map(\.type.multiArrayType.shape) == [[10], [1], [1]])
        #expect(description.output.map(\.name) == ["out"])
        #expect(description.output[0].type.multiArrayType.shape == [1])
        #expect(description.trainingInput.map(\.name) == ["numeric", "chas", "rad", "out_true"])
        #expect(description.metadata.userDefined[CoreMLExporter.modelNameKey] == "housing")

        let update = network.updateParams
        #expect(update.lossLayers.count == 1)
        #expect(update.lossLayers[0].meanSquaredErrorLossLayer.input == "out")
        #expect(update.lossLayers[0].meanSquaredErrorLossLayer.target == "out_true")
        let sgd = update.optimizer.sgdOptimizer
        #expect(sgd.learningRate.defaultValue == 0.01)
        #expect(sgd.momentum.defaultValue == 0.9)
        #expect(sgd.miniBatchSize.defaultValue == 16 && sgd.miniBatchSize.set.values == [16])
        #expect(update.epochs.defaultValue == 5 && update.epochs.set.values == [5])
        #expect(update.shuffle.defaultValue)
    }

    @Test func exportingTwiceGivesIdenticalBytes() throws {
        for spec in [Models.housing(), Models.convolutional()] {
            let weights = Models.weights(for: spec)
            let first = try CoreMLExporter().export(spec, weights: weights)
            let second = try CoreMLExporter().export(spec, weights: weights.reversed())
            #expect(first == second)
        }
    }

    @Test func convolutionKeepsStrideOutOfDilationAndMapsPadding() throws {
        let model = try export(Models.convolutional())
        let layers = model.neuralNetwork.layers
        let conv1 = layers[0].convolution
        #expect(conv1.stride == [2, 2])
        #expect(conv1.dilationFactor == [1, 1])
        #expect(conv1.kernelSize == [3, 3])
        #expect(conv1.outputChannels == 4 && conv1.kernelChannels == 1 && conv1.nGroups == 1)
        #expect(conv1.same.asymmetryMode == .bottomRightHeavy)
        let conv2 = layers[2].convolution
        #expect(!conv2.hasBias_p)
        #expect(conv2.valid.paddingAmounts.borderAmounts.map { [$0.startEdgeSize, $0.endEdgeSize] } == [[1, 1], [1, 1]])
        #expect(layers[4].pooling.type == .max && layers[4].pooling.stride == [2, 2])
        #expect(!layers[0].isUpdatable && layers[2].isUpdatable && layers[6].isUpdatable)
        #expect(model.description_p.output[0].type.multiArrayType.shape == [3])
        let update = model.neuralNetwork.updateParams
        #expect(update.lossLayers[0].categoricalCrossEntropyLossLayer.input == "probs")
        let target = try #require(model.description_p.trainingInput.last)
        #expect(target.name == "probs_true" && target.type.multiArrayType.dataType == .int32 && target.type.multiArrayType.shape == [1])
        let adam = update.optimizer.adamOptimizer
        #expect([adam.learningRate.defaultValue, adam.beta1.defaultValue, adam.beta2.defaultValue, adam.eps.defaultValue] == [0.003, 0.8, 0.99, 1e-6])
        #expect(adam.miniBatchSize.defaultValue == 8)
    }

    @Test func rangesAndDataTypeFollowOptions() throws {
        var options = CoreMLExportOptions(arrayDataType: .float32, shuffle: false)
        options.ranges = CoreMLUpdateRanges(learningRate: 0.001...0.1, momentum: 0.5...0.95, miniBatchSizes: .set([8, 16, 32]), epochs: .range(1...20))
        let model = try export(Models.housing(), options: options)
        let sgd = model.neuralNetwork.updateParams.optimizer.sgdOptimizer
        #expect(sgd.learningRate.range.minValue == 0.001 && sgd.learningRate.range.maxValue == 0.1)
        #expect(sgd.momentum.range.minValue == 0.5)
        #expect(sgd.miniBatchSize.set.values == [8, 16, 32])
        #expect(model.neuralNetwork.updateParams.epochs.range.maxValue == 20)
        #expect(!model.neuralNetwork.updateParams.shuffle.defaultValue)
        #expect(model.description_p.input[0].type.multiArrayType.dataType == .float32)

        options.ranges.learningRate = 0.05...0.1
        expectError(.unsupportedFeature, layer: nil, containing: "learning rate 0.01 is outside") {
            _ = try CoreMLExporter(options: options).export(Models.housing(), weights: Models.weights(for: Models.housing()))
        }
    }

    @Test func predictionOnlyExportNeedsNoTraining() throws {
        var spec = Models.housing()
        spec.training = nil
        let model = try export(spec, options: CoreMLExportOptions(updatable: false))
        #expect(!model.isUpdatable)
        #expect(!model.neuralNetwork.hasUpdateParams)
        #expect(model.neuralNetwork.layers.allSatisfy { !$0.isUpdatable })
        expectError(.invalidModel, layer: nil, containing: "needs the model's training settings") { _ = try export(spec) }
    }

    /// Training settings a device's Core ML update would turn into infinite weights (β of 1, ε of 0) or no update (a
    /// learning rate of 0) are refused as a hosted model's are, though they lie in Core ML's own ranges.
    @Test func trainingSettingsOutsideTheModelLimitsAreRefused() throws {
        for optimizer in [OptimizerSpec.adam(beta1: 1), .adam(beta2: 1), .adam(epsilon: 0), .sgd(learningRate: 0), .sgd(momentum: 1)] {
            var spec = Models.housing()
            spec.training?.optimizer = optimizer
            expectError(.invalidModel, layer: nil, containing: "training") { _ = try export(spec) }
        }
        // A prediction-only export carries no training settings: not refused for them.
        var spec = Models.housing()
        spec.training?.optimizer = .adam(beta1: 1)
        _ = try export(spec, options: CoreMLExportOptions(updatable: false))
    }

    @Test func trainableEmbeddingIsRejectedByName() {
        var spec = Models.housing()
        spec.layers[1].frozen = false
        expectError(.updateRules, layer: "radEmbedding", containing: "only inner-product and convolution") { _ = try export(spec) }
    }

    @Test func updatableLayerBeforeConcatIsRejectedNamingTheBlocker() {
        let spec = ModelSpec(
            name: "blocked",
            inputs: [InputSpec(name: "x", shape: [4]), InputSpec(name: "k", shape: [1], categorical: true)],
            layers: [
                LayerSpec(name: "pre", type: .dense, inputs: ["x"], units: 3, inputSize: 4),
                LayerSpec(name: "emb", type: .embedding, inputs: ["k"], frozen: true, vocabularySize: 3, embeddingSize: 2),
                LayerSpec(name: "joined", type: .concat, inputs: ["pre", "emb"]),
                LayerSpec(name: "out", type: .dense, inputs: ["joined"], units: 1, inputSize: 5),
            ],
            training: TrainingSpec(loss: .meanSquaredError)
        )
        expectError(.updateRules, layer: "joined", containing: "between updatable layer 'pre'") { _ = try export(spec) }
        var frozen = spec
        frozen.layers[0].frozen = true
        #expect(throws: Never.self) { _ = try export(frozen) }
    }

    @Test func crossEntropyMustFollowSoftmax() {
        var spec = Models.convolutional()
        spec.layers.removeLast()
        spec.output = "fc"
        expectError(.updateRules, layer: "fc_loss", containing: "must read a softmax output") { _ = try export(spec) }
    }

    @Test func softmaxBeforeMeanSquaredErrorBlocksBackPropagation() {
        var spec = Models.convolutional()
        spec.training?.loss = .meanSquaredError
        expectError(.updateRules, layer: "probs", containing: "does not support back-propagation") { _ = try export(spec) }
    }

    @Test func allFrozenModelCannotBeUpdatable() {
        var spec = Models.housing()
        for index in spec.layers.indices { spec.layers[index].frozen = true }
        expectError(.updateRules, layer: nil, containing: "none of its layers") { _ = try export(spec) }
    }

    @Test func dropoutIsRejectedOrOmittedOnRequest() throws {
        var spec = Models.housing()
        spec.layers.insert(LayerSpec(name: "drop", type: .dropout, inputs: ["relu1"], rate: 0.2), at: 5)
        spec.layers[6].inputs = ["drop"]
        expectError(.unsupportedLayer, layer: "drop", containing: "no dropout") { _ = try export(spec) }
        let model = try export(spec, options: CoreMLExportOptions(dropout: .omit))
        #expect(!model.neuralNetwork.layers.contains { $0.name == "drop" })
        #expect(model.neuralNetwork.layers.first { $0.name == "dense2" }?.input == ["relu1"])
    }

    @Test func aOneDimensionalConvolutionHasNoCoreMLCounterpart() {
        let spec = ModelSpec(
            name: "sensor", inputs: [InputSpec(name: "x", shape: [3, 16])],
            layers: [
                LayerSpec(name: "conv", type: .conv1d, inputs: ["x"], units: 4, kernelSize: [3]),
                LayerSpec(name: "flat", type: .flatten, inputs: ["conv"]),
                LayerSpec(name: "out", type: .dense, inputs: ["flat"], units: 2, inputSize: 56),
            ],
            training: TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.1)))
        expectError(.unsupportedLayer, layer: "conv", containing: "no Core ML counterpart") { _ = try export(spec) }
    }

    @Test(arguments: [LayerType.lstm, .gru]) func aRecurrentLayerIsRefusedWithTheReason(type: LayerType) {
        let spec = ModelSpec(
            name: "text", inputs: [InputSpec(name: "x", shape: [8, 3])],
            layers: [
                LayerSpec(name: "rnn", type: type, inputs: ["x"], units: 4),
                LayerSpec(name: "out", type: .dense, inputs: ["rnn"], units: 2, inputSize: 4),
            ],
            training: TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.1)))
        expectError(.unsupportedLayer, layer: "rnn", containing: "cannot be trained by Core ML") { _ = try export(spec) }
    }

    @Test func aDenseLayerOverTheLastAxisOfAnImageIsRefused() {
        let spec = ModelSpec(
            name: "rows", inputs: [InputSpec(name: "x", shape: [1, 4, 4])],
            layers: [LayerSpec(name: "out", type: .dense, inputs: ["x"], units: 2, inputSize: 4)],
            training: TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.1)))
        expectError(.unsupportedLayer, layer: "out", containing: "add a flatten layer") { _ = try export(spec) }
    }

    @Test func unrepresentableTrainingSettingsAreRejectedUnlessDropped() throws {
        let spec = Models.housing(optimizer: .sgd(learningRate: 0.01, weightDecay: 1e-4))
        expectError(.unsupportedFeature, layer: nil, containing: "weight decay") { _ = try export(spec) }
        var capped = Models.housing()
        capped.training?.maxUpdates = 100
        expectError(.unsupportedFeature, layer: nil, containing: "update cap") { _ = try export(capped) }
        let model = try export(spec, options: CoreMLExportOptions(dropsUnrepresentableTrainingSettings: true))
        #expect(model.isUpdatable)
    }

    @Test func weightProblemsNameTheTensor() {
        let spec = Models.housing()
        var weights = Models.weights(for: spec)
        let missing = weights.filter { $0.name != "dense2.bias" }
        expectError(.weightMismatch, layer: "dense2", containing: "no tensor 'dense2.bias'") { _ = try export(spec, weights: missing) }
        weights.append(TensorRecord(name: "stray.weight", shape: [2], values: [1, 2]))
        expectError(.weightMismatch, layer: nil, containing: "'stray.weight' belongs to no layer") { _ = try export(spec, weights: weights) }
        var wrong = Models.weights(for: spec)
        wrong[wrong.firstIndex { $0.name == "dense2.weight" }!] = TensorRecord(
            name: "dense2.weight", shape: [32, 63], values: .init(repeating: 0, count: 32 * 63))
        expectError(.weightMismatch, layer: "dense2", containing: "inputSize is 64 but the weight says 63") { _ = try export(spec, weights: wrong) }
    }

    @Test func concatOfImagesIsRejected() {
        let spec = ModelSpec(
            name: "images",
            inputs: [InputSpec(name: "a", shape: [1, 4, 4]), InputSpec(name: "b", shape: [1, 4, 4])],
            layers: [
                LayerSpec(name: "joined", type: .concat, inputs: ["a", "b"]),
                LayerSpec(name: "flat", type: .flatten, inputs: ["joined"]),
                LayerSpec(name: "out", type: .dense, inputs: ["flat"], units: 1, inputSize: 32),
            ],
            training: TrainingSpec(loss: .meanSquaredError)
        )
        expectError(.unsupportedLayer, layer: "joined", containing: "Core ML joins channels") { _ = try export(spec) }
    }

    /// Core ML's same padding (bottom-right heavy) and valid padding give Orchard's output sizes.
    @Test(arguments: [(9, 3, 2), (12, 3, 2), (7, 2, 1), (5, 4, 3), (28, 5, 1), (6, 1, 2)])
    func coreMLOutputSizesMatchOrchardPadding(input: Int, kernel: Int, stride: Int) throws {
        for padding in [Padding.same, .valid, .explicit(height: 1, width: 2)] {
            guard padding.resolve(input: input, kernel: kernel, stride: stride, axis: 0).output > 0 else { continue }
            let spec = ModelSpec(
                name: "pad",
                inputs: [InputSpec(name: "image", shape: [1, input, input])],
                layers: [
                    LayerSpec(
                        name: "conv", type: .conv2d, inputs: ["image"], units: 1, useBias: false, kernelSize: [kernel, kernel],
                        strides: [stride, stride], padding: padding, inChannels: 1),
                    LayerSpec(name: "pool", type: .maxPool2d, inputs: ["image"], kernelSize: [kernel, kernel], strides: [stride, stride], padding: padding),
                ],
                output: "conv"
            )
            let model = try export(spec, options: CoreMLExportOptions(updatable: false))
            let shapes = try CoreMLShapes.blobShapes(inputs: ["image": [1, input, input]], layers: model.neuralNetwork.layers, lenient: false)
            let height = padding.resolve(input: input, kernel: kernel, stride: stride, axis: 0).output
            let width = padding.resolve(input: input, kernel: kernel, stride: stride, axis: 1).output
            #expect(shapes["conv"] == [1, height, width], "\(padding)")
            #expect(shapes["pool"] == [1, height, width], "\(padding)")
        }
    }
}
