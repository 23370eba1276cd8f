import Foundation
import OrchardCoreML
import OrchardFormats
import OrchardML
import OrchardTesting
import Testing

/// Cross-checks with Apple's coremltools (run through `python3`): Orchard's files load in coremltools with the
/// expected content, and models built with coremltools' `NeuralNetworkBuilder` import into Orchard. Skipped, with
/// the install command as the reason, when `coremltools`, `numpy` or `safetensors` is missing; CI sets
/// `ORCHARD_REQUIRE_PYTHON=1`, under which they run and a missing package fails them.
@Suite(.serialized, PythonModules.requirement(Python.modules))
struct CoreMLToolsInteropTests {
    private func values(_ any: Any?) -> [Float] { ((any as? [Any]) ?? []).compactMap { ($0 as? NSNumber)?.floatValue } }
    private func dict(_ any: Any?) -> [String: Any] { any as? [String: Any] ?? [:] }
    private func list(_ any: Any?) -> [[String: Any]] { any as? [[String: Any]] ?? [] }
    private func ints(_ any: Any?) -> [Int] { ((any as? [Any]) ?? []).compactMap { ($0 as? NSNumber)?.intValue } }

    /// Exports `spec`, has coremltools load and describe the file, and returns the description.
    private func describeExport(_ spec: ModelSpec, weights: [TensorRecord]) async throws -> [String: Any] {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("\(spec.name).mlmodel")
        try Data(CoreMLExporter().export(spec, weights: weights)).write(to: file)
        return try await Python.json("describe_mlmodel.py", [file.path])
    }

    @Test func housingModelLoadsInCoreMLToolsAsUpdatable() async throws {
        try PythonModules.require(Python.modules)
        let spec = Models.housing()
        let weights = Models.weights(for: spec, seed: 3)
        let byName = Dictionary(uniqueKeysWithValues: weights.map { ($0.name, $0) })
        let described = try await describeExport(spec, weights: weights)

        #expect(described["specificationVersion"] as? Int == 4)
        #expect(described["isUpdatable"] as? Bool == true)
        #expect(described["type"] as? String == "neuralNetwork")
        #expect(list(described["inputs"]).map { ints($0["shape"]) } == [[10], [1], [1]])
        #expect(list(described["trainingInputs"]).map { $0["name"] as? String } == ["numeric", "chas", "rad", "out_true"])
        #expect(dict(dict(described["metadata"])["userDefined"])["orchard.modelName"] as? String == "housing")

        let layers = list(described["layers"])
        #expect(layers.map { $0["name"] as? String } == spec.layers.map(\.name))
        #expect(
            layers.map { $0["type"] as? String } == [
                "embedding", "embedding", "concat", "innerProduct", "activation", "innerProduct", "activation", "innerProduct",
            ])
        #expect(layers.map { $0["isUpdatable"] as? Bool } == [false, false, false, true, false, true, false, true])
        for layer in layers where layer["type"] as? String == "innerProduct" {
            let name = layer["name"] as! String
            #expect(values(dict(layer["weights"])["values"]) == byName["\(name).weight"]?.values, "\(name)")
            #expect(values(dict(layer["bias"])["values"]) == byName["\(name).bias"]?.values, "\(name)")
            #expect(dict(layer["weights"])["isUpdatable"] as? Bool == true)
        }
        // coremltools reads the embedding table as outputChannels × inputDim: Orchard's table transposed.
        let chas = layers[0]
        #expect(chas["inputDim"] as? Int == 2 && chas["outputChannels"] as? Int == 2)
        let table = try #require(byName["chasEmbedding.weight"])
        #expect(values(dict(chas["weights"])["values"]) == [table.values[0], table.values[2], table.values[1], table.values[3]])

        let update = dict(described["updateParams"])
        let loss = try #require(list(update["lossLayers"]).first)
        #expect(loss["type"] as? String == "meanSquaredErrorLossLayer")
        #expect(loss["input"] as? String == "out" && loss["target"] as? String == "out_true")
        let optimizer = dict(update["optimizer"])
        #expect(optimizer["type"] as? String == "sgdOptimizer")
        #expect(dict(optimizer["learningRate"])["default"] as? Double == 0.01)
        #expect(ints(dict(optimizer["learningRate"])["range"]) == [0, 1])
        #expect(dict(optimizer["momentum"])["default"] as? Double == 0.9)
        #expect(dict(optimizer["miniBatchSize"])["default"] as? Int == 16)
        #expect(ints(dict(optimizer["miniBatchSize"])["set"]) == [16])
        #expect(dict(update["epochs"])["default"] as? Int == 5)
        #expect(update["shuffle"] as? Bool == true)
    }

    @Test func convolutionalClassifierLoadsInCoreMLTools() async throws {
        try PythonModules.require(Python.modules)
        let spec = Models.convolutional()
        let weights = Models.weights(for: spec, seed: 4)
        let described = try await describeExport(spec, weights: weights)
        let layers = list(described["layers"])
        let conv1 = layers[0]
        #expect(ints(conv1["stride"]) == [2, 2])
        #expect(ints(conv1["dilationFactor"]) == [1, 1])
        #expect(conv1["padding"] as? String == "same")
        #expect(conv1["isUpdatable"] as? Bool == false)
        #expect(values(dict(conv1["weights"])["values"]) == weights.first { $0.name == "conv1.weight" }?.values)
        let conv2 = layers[2]
        #expect(conv2["padding"] as? String == "valid")
        #expect((conv2["paddingAmounts"] as? [[Int]]) == [[1, 1], [1, 1]])
        #expect(conv2["hasBias"] as? Bool == false)
        #expect(conv2["isUpdatable"] as? Bool == true)
        #expect(layers[4]["type"] as? String == "pooling" && ints(layers[4]["kernelSize"]) == [2, 2])
        #expect(layers.last?["type"] as? String == "softmax")

        let update = dict(described["updateParams"])
        let loss = try #require(list(update["lossLayers"]).first)
        #expect(loss["type"] as? String == "categoricalCrossEntropyLossLayer" && loss["input"] as? String == "probs")
        let target = try #require(list(described["trainingInputs"]).last)
        #expect(target["name"] as? String == "probs_true" && target["dataType"] as? String == "INT32")
        let optimizer = dict(update["optimizer"])
        #expect(optimizer["type"] as? String == "adamOptimizer")
        #expect(dict(optimizer["beta1"])["default"] as? Double == 0.8)
        #expect(dict(optimizer["beta2"])["default"] as? Double == 0.99)
        #expect(dict(optimizer["eps"])["default"] as? Double == 1e-6)
        #expect(dict(optimizer["learningRate"])["default"] as? Double == 0.003)
        #expect(dict(update["epochs"])["default"] as? Int == 4)
    }

    /// Models built by coremltools, with the reference weights NumPy wrote for them.
    private struct Built {
        var imported: [String: CoreMLImportedModel] = [:]
        var references: [String: [String: TensorRecord]] = [:]
        var manifest: [String: [String: Any]] = [:]
        var unsupportedError: (any Error)?
        var rank3Error: (any Error)?
    }

    private func buildWithCoreMLTools() async throws -> Built {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let manifest = try await Python.json("build_models.py", [directory.path, "11"])
        var built = Built()
        for (name, info) in manifest {
            built.manifest[name] = info as? [String: Any]
            let bytes = try [UInt8](Data(contentsOf: directory.appendingPathComponent("\(name).mlmodel")))
            built.imported[name] = try CoreMLImporter().importModel(from: bytes)
            let reference = try Safetensors.decode(Data(contentsOf: directory.appendingPathComponent("\(name).reference.safetensors")))
            built.references[name] = reference.byName
        }
        do {
            _ = try CoreMLImporter().importModel(from: [UInt8](Data(contentsOf: directory.appendingPathComponent("unsupported.mlmodel"))))
        } catch {
            built.unsupportedError = error
        }
        do {
            _ = try CoreMLImporter().importModel(from: [UInt8](Data(contentsOf: directory.appendingPathComponent("refused_exact_rank3.mlmodel"))))
        } catch {
            built.rank3Error = error
        }
        return built
    }

    /// Every model coremltools built, imported and exported again by Orchard, reads back in coremltools with the same
    /// updatable layers, loss, optimizer, learning rate, epochs and inner-product weights.
    @Test func coreMLToolsModelsRoundTripThroughOrchardsExporter() async throws {
        try PythonModules.require(Python.modules)
        let built = try await buildWithCoreMLTools()
        try #require(built.imported.count == 9)
        for (name, imported) in built.imported.sorted(by: { $0.key < $1.key }) {
            let info = built.manifest[name]!
            let described = try await describeExport(imported.spec, weights: imported.weights)
            #expect(described["isUpdatable"] as? Bool == true, "\(name)")
            let layers = list(described["layers"])
            let updatable = Set(layers.filter { $0["isUpdatable"] as? Bool == true }.compactMap { $0["name"] as? String })
            #expect(updatable == Set((info["updatable"] as? [String]) ?? []), "\(name)")
            let update = dict(described["updateParams"])
            let loss = list(update["lossLayers"]).first?["type"] as? String
            #expect(loss == (info["loss"] as? String == "mse" ? "meanSquaredErrorLossLayer" : "categoricalCrossEntropyLossLayer"), "\(name)")
            let optimizer = dict(update["optimizer"])
            #expect(optimizer["type"] as? String == (info["optimizer"] as? String == "adam" ? "adamOptimizer" : "sgdOptimizer"), "\(name)")
            #expect(dict(optimizer["learningRate"])["default"] as? Double == info["learningRate"] as? Double, "\(name)")
            #expect(dict(optimizer["miniBatchSize"])["default"] as? Int == info["batchSize"] as? Int, "\(name)")
            #expect(dict(update["epochs"])["default"] as? Int == info["epochs"] as? Int, "\(name)")
            for layer in layers where layer["type"] as? String == "innerProduct" {
                let layerName = layer["name"] as? String ?? ""
                let original = imported.weights.first { $0.name == "\(layerName).weight" }
                #expect(values(dict(layer["weights"])["values"]) == original?.values, "\(name).\(layerName)")
            }
        }
    }

    @Test func coreMLToolsModelsImportWithWeightsAndTrainingSettings() async throws {
        try PythonModules.require(Python.modules)
        let built = try await buildWithCoreMLTools()
        #expect(
            built.imported.keys.sorted() == [
                "avgpool", "ce_adam", "classifier", "conv", "conv_1to4", "exact_classifier", "exact_conv", "exact_mse_sgd", "mse_sgd",
            ])
        #expect(built.imported["avgpool"]?.spec.layers.map(\.type) == [.conv2d, .avgPool2d, .avgPool2d, .flatten, .dense, .softmax])
        #expect(built.imported["avgpool"]?.spec.layers[1].padding == .same)
        for (name, model) in built.imported {
            let info = built.manifest[name]!
            let reference = built.references[name]!
            // Weights, in Orchard's layouts, equal those NumPy wrote independently.
            for record in model.weights {
                let expected = try #require(reference[record.name], "\(name): unexpected tensor \(record.name)")
                #expect(record.shape == expected.shape, "\(name).\(record.name)")
                #expect(record.values == expected.values, "\(name).\(record.name)")
            }
            #expect(model.weights.count == reference.keys.filter { !$0.hasPrefix("input.") && $0 != "expected" }.count, "\(name)")
            // Frozen flags follow the updatable flags.
            let frozen = Set(model.spec.layers.filter(\.frozen).map(\.name))
            #expect(frozen == Set((info["frozen"] as? [String]) ?? []), "\(name)")
            let updatable = Set(model.spec.layers.filter { !$0.frozen && [.dense, .conv2d].contains($0.type) }.map(\.name))
            #expect(updatable == Set((info["updatable"] as? [String]) ?? []), "\(name)")
            #expect(model.spec.output == info["output"] as? String, "\(name)")
            // Training settings.
            let training = try #require(model.spec.training, "\(name)")
            #expect(training.loss.rawValue == info["loss"] as? String, "\(name)")
            #expect(training.optimizer.type == info["optimizer"] as? String, "\(name)")
            #expect(training.optimizer.learningRate == info["learningRate"] as? Double, "\(name)")
            #expect(training.batchSize == info["batchSize"] as? Int, "\(name)")
            #expect(training.epochs == info["epochs"] as? Int, "\(name)")
            if let momentum = info["momentum"] as? Double { #expect(training.optimizer.momentum == momentum, "\(name)") }
        }

        let adam = try #require(built.imported["ce_adam"])
        #expect(adam.spec.training?.optimizer == .adam(learningRate: 0.002, beta1: 0.85, beta2: 0.995, epsilon: 1e-7))
        #expect(adam.ranges?.epochs == .set([5, 10, 20]))
        #expect(adam.ranges?.learningRate == 0.0001...0.5)
        #expect(adam.spec.inputs.map(\.categorical) == [false, true])
        #expect(adam.spec.layers.map(\.type) == [.embedding, .concat, .dense, .tanh, .dense, .softmax])
        #expect(adam.spec.layers[4].useBias == false)
        #expect(built.imported["mse_sgd"]?.ranges?.miniBatchSizes == .set([4, 8, 16]))

        let conv = try #require(built.imported["conv"])
        #expect(conv.spec.layers.map(\.type) == [.conv2d, .relu, .conv2d, .maxPool2d, .flatten, .dense, .softmax])
        #expect(conv.spec.layers[0].padding == .same && conv.spec.layers[0].strides == [2, 2])
        #expect(conv.spec.layers[2].padding == .explicit(height: 1, width: 1))
        #expect(conv.spec.layers[3].padding == .valid && conv.spec.layers[3].strides == [2, 2])

        let classifier = try #require(built.imported["classifier"])
        #expect(classifier.classLabels == ["cat", "dog", "eel"])
        // The identity linear activation is left out: the first dense layer reads the input directly.
        #expect(classifier.spec.layers.map(\.type) == [.dense, .sigmoid, .dense, .softmax])
        #expect(classifier.spec.layers[0].inputs == ["features"])

        // Orchard's engine, running the imported models, predicts what a NumPy forward pass of the same weights does.
        for (name, imported) in built.imported.sorted(by: { $0.key < $1.key }) {
            let reference = built.references[name]!
            var model = try Model(spec: imported.spec)
            try model.loadWeights(from: SafetensorsArchive(tensors: imported.weights))
            var feeds: [String: Tensor] = [:]
            for input in imported.spec.inputs {
                let record = try #require(reference["input.\(input.name)"], "\(name): no input \(input.name)")
                feeds[input.name] = Tensor(shape: record.shape, scalars: record.values)
            }
            let predicted = try model(feeds)
            let expected = try #require(reference["expected"])
            #expect(predicted.shape == expected.shape, "\(name)")
            let worst = zip(predicted.scalars, expected.values).map { abs($0 - $1) }.max() ?? .infinity
            #expect(worst <= 1e-5, "\(name): largest difference from NumPy \(worst)")
        }

        let error = try #require(built.unsupportedError as? CoreMLError)
        #expect(error.code == .unsupportedLayer && error.layer == "norm" && error.message.contains("batchnorm"))

        // A 3x3 convolution from one channel to four keeps its channel counts.
        let oneToFour = try #require(built.imported["conv_1to4"])
        #expect(oneToFour.spec.layers[0].inChannels == 1 && oneToFour.spec.layers[0].units == 4)
        #expect(oneToFour.spec.inputs.map(\.shape) == [[1, 5, 5]])
        // Exact shape mapping: the batch axis of [1, C] and [1, C, H, W] inputs is dropped; layers as under rank-5.
        #expect(built.imported["exact_mse_sgd"]?.spec.inputs.map(\.shape) == [[8]])
        #expect(built.imported["exact_classifier"]?.spec.inputs.map(\.shape) == [[6]])
        let exactConv = try #require(built.imported["exact_conv"])
        #expect(exactConv.spec.inputs.map(\.shape) == [[2, 7, 7]])
        #expect(exactConv.spec.layers.map(\.type) == [.conv2d, .relu, .maxPool2d, .flatten, .dense, .softmax])
        let rank3 = try #require(built.rank3Error as? CoreMLError)
        #expect(rank3.code == .unsupportedFeature && rank3.message.contains("[2, 3, 4]") && rank3.message.contains("exact shape mapping"), "\(rank3)")
    }
}
