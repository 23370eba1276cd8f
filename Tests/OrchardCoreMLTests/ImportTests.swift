import Foundation
import OrchardFormats
import SwiftProtobuf
import Testing

@testable import OrchardCoreML

@Suite struct ImportTests {
    private func sorted(_ records: [TensorRecord]) -> [TensorRecord] { records.sorted { $0.name < $1.name } }

    @Test(arguments: [Models.housing(), Models.convolutional()])
    func exportThenImportGivesBackTheModel(spec: ModelSpec) throws {
        let weights = Models.weights(for: spec, seed: 9)
        let bytes = try CoreMLExporter().export(spec, weights: weights)
        let imported = try CoreMLImporter().importModel(from: bytes)
        #expect(imported.spec == spec)
        #expect(sorted(imported.weights) == sorted(weights))
        #expect(imported.classLabels.isEmpty)
        #expect(imported.ranges == CoreMLUpdateRanges(miniBatchSizes: .set([spec.training!.batchSize]), epochs: .set([spec.training!.epochs])))
        // And the re-export is the same file.
        #expect(try CoreMLExporter().export(imported.spec, weights: imported.weights) == bytes)
    }

    @Test func rangesAndMetadataSurviveARoundTrip() throws {
        let spec = Models.housing()
        let ranges = CoreMLUpdateRanges(learningRate: 0.001...0.5, momentum: 0...0.99, miniBatchSizes: .range(4...64), epochs: .set([1, 5, 10]))
        let metadata = CoreMLMetadata(shortDescription: "house prices", author: "Orchard", license: "MIT", version: "2")
        let bytes = try CoreMLExporter(options: CoreMLExportOptions(ranges: ranges, metadata: metadata)).export(spec, weights: Models.weights(for: spec))
        let imported = try CoreMLImporter().importModel(from: bytes)
        #expect(imported.ranges == ranges)
        #expect(imported.metadata == metadata)
    }

    @Test func predictionOnlyModelImportsWithoutTrainingAndUnfrozen() throws {
        var spec = Models.housing()
        spec.training = nil
        let bytes = try CoreMLExporter(options: CoreMLExportOptions(updatable: false)).export(spec, weights: Models.weights(for: spec))
        let imported = try CoreMLImporter().importModel(from: bytes)
        #expect(imported.spec.training == nil)
        #expect(imported.spec.layers.allSatisfy { !$0.frozen })
        #expect(imported.ranges == nil)
    }

    private func makeLayer(_ name: String, reads input: String, writes output: String) -> ProtoLayer {
        var layer = ProtoLayer()
        layer.name = name
        layer.input = [input]
        layer.output = [output]
        return layer
    }

    private func model(with layer: ProtoLayer, input: [Int64] = [4]) -> CoreML_Specification_Model {
        var model = CoreML_Specification_Model()
        model.specificationVersion = 4
        var feature = CoreML_Specification_FeatureDescription()
        feature.name = "x"
        feature.type.multiArrayType.shape = input
        model.description_p.input = [feature]
        feature.name = layer.output.first ?? "y"
        model.description_p.output = [feature]
        var network = CoreML_Specification_NeuralNetwork()
        network.layers = [layer]
        model.neuralNetwork = network
        return model
    }

    private func importError(_ model: CoreML_Specification_Model) throws -> CoreMLError {
        let bytes: [UInt8] = try model.serializedBytes()
        do {
            _ = try CoreMLImporter().importModel(from: bytes)
        } catch {
            return error
        }
        throw CoreMLError(.invalidModel, "the import did not fail")
    }

    /// A network of `layers` over input `x` of `input`, with output `output`.
    private func network(_ layers: [ProtoLayer], input: [Int64], output: String) -> CoreML_Specification_Model {
        var model = self.model(with: layers[0], input: input)
        model.description_p.output[0].name = output
        model.neuralNetwork.layers = layers
        return model
    }

    /// A layer that writes a blob name again (in place) does not change what an earlier layer read under that name: the
    /// pooling below reads x as [3, 4, 4] though x is [3] by the end (reading the final shape indexed past it).
    @Test func aBlobWrittenAgainKeepsTheShapeEarlierLayersRead() throws {
        var pool = makeLayer("pool", reads: "x", writes: "p")
        var pooling = CoreML_Specification_PoolingLayerParams()
        pooling.type = .max
        pooling.globalPooling = true
        pool.pooling = pooling
        var flatten = makeLayer("flat", reads: "p", writes: "x")
        flatten.flatten = CoreML_Specification_FlattenLayerParams()
        var model = network([pool, flatten], input: [3, 4, 4], output: "x")
        model.specificationVersion = 1  // rank-5 mapping: x is [C, H, W]
        let imported = try CoreMLImporter().importModel(from: try model.serializedBytes())
        #expect(imported.spec.layers.map(\.type) == [.maxPool2d, .flatten], "\(imported.spec.layers)")
    }

    /// Sizes that add up past what a shape can hold are refused, on import and on inspection (they overflowed, or an
    /// empty input shape was indexed).
    @Test func aConcatPastTheLargestSizeOrOfAnEmptyShapeIsRefused() throws {
        var flatten = makeLayer("flat", reads: "x", writes: "f")
        flatten.flatten = CoreML_Specification_FlattenLayerParams()
        var concat = ProtoLayer()
        concat.name = "cat"
        concat.input = ["f", "f"]
        concat.output = ["c"]
        concat.concat = CoreML_Specification_ConcatLayerParams()
        let huge = network([flatten, concat], input: [2_147_483_648, 2_147_483_648, 1], output: "c")
        let error = try importError(huge)
        #expect(error.code == .invalidModel && error.message.contains("channels"), "\(error)")
        _ = try CoreMLModelSummary(bytes: huge.serializedBytes())

        var direct = concat
        direct.input = ["x", "x"]
        let empty = network([direct], input: [], output: "c")
        _ = try? CoreMLModelSummary(bytes: empty.serializedBytes())
        #expect(throws: CoreMLError.self) { try CoreMLImporter().importModel(from: try empty.serializedBytes()) }
    }

    @Test func unsupportedLayerIsNamedWithItsCoreMLType() throws {
        // A batch-normalization layer (field 160), which the schema subset does not model, written as raw bytes.
        let layer = makeLayer("norm", reads: "x", writes: "y")
        var bytes: [UInt8] = try layer.serializedBytes()
        bytes += [0x82, 0x0A, 0x00]  // tag (160 << 3 | 2) as a varint, then an empty message
        let decoded = try ProtoLayer(serializedBytes: bytes)
        let error = try importError(model(with: decoded, input: [3, 4, 4]))
        #expect(error.code == .unsupportedLayer)
        #expect(error.layer == "norm")
        #expect(error.message.contains("'batchnorm'"))
        // Inspection still lists it.
        let summary = try CoreMLModelSummary(bytes: model(with: decoded, input: [3, 4, 4]).serializedBytes())
        #expect(summary.layers.map(\.type) == ["batchnorm"])
    }

    @Test func unsupportedActivationAndPoolingAreNamed() throws {
        var layer = makeLayer("scale", reads: "x", writes: "y")
        var linear = CoreML_Specification_ActivationLinear()
        linear.alpha = 2
        layer.activation.linear = linear
        var error = try importError(model(with: layer))
        #expect(error.code == .unsupportedLayer && error.layer == "scale" && error.message.contains("linear activation"))

        layer.name = "l2"
        var pooling = CoreML_Specification_PoolingLayerParams()
        pooling.type = .l2
        pooling.kernelSize = [2, 2]
        pooling.stride = [2, 2]
        layer.pooling = pooling
        error = try importError(model(with: layer, input: [1, 4, 4]))
        #expect(error.code == .unsupportedLayer && error.layer == "l2" && error.message.contains("pooling.L2"), "\(error)")

        // Average pooling is read, unless it counts padded zeros (Orchard leaves padding out of the average).
        layer.name = "avg"
        pooling.type = .average
        pooling.same = CoreML_Specification_SamePadding()
        pooling.avgPoolExcludePadding = false
        layer.pooling = pooling
        error = try importError(model(with: layer, input: [1, 5, 5]))
        #expect(error.code == .unsupportedFeature && error.layer == "avg" && error.message.contains("counts padded zeros"), "\(error)")
    }

    @Test func otherModelTypesAreNamed() throws {
        var model = CoreML_Specification_Model()
        model.specificationVersion = 1
        var bytes: [UInt8] = try model.serializedBytes()
        bytes += [0xE2, 0x12, 0x00]  // field 300 (glmRegressor), an empty message
        do {
            _ = try CoreMLImporter().importModel(from: bytes)
            Issue.record("a GLM regressor imported")
        } catch {
            #expect(error.code == .unsupportedFeature)
            #expect(error.message.contains("glmRegressor"))
        }
    }

    @Test func garbageIsAMalformedFile() {
        #expect(throws: CoreMLError.self) { _ = try CoreMLImporter().importModel(from: [0xFF, 0xFF, 0xFF]) }
        do {
            _ = try CoreMLImporter().importModel(from: [0x0A, 0x10, 0x01])
        } catch {
            #expect(error.code == .malformedFile)
        }
    }

    @Test func halfPrecisionWeightsAreWidened() throws {
        var layer = makeLayer("fc", reads: "x", writes: "y")
        var p = CoreML_Specification_InnerProductLayerParams()
        p.inputChannels = 4
        p.outputChannels = 1
        // 1, -2, 0.5, 65504 in IEEE half precision, little-endian.
        p.weights.float16Value = Data([0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38, 0xFF, 0x7B])
        layer.innerProduct = p
        let imported = try CoreMLImporter().importModel(from: model(with: layer).serializedBytes())
        #expect(imported.weights == [TensorRecord(name: "fc.weight", shape: [1, 4], values: [1, -2, 0.5, 65504])])
        #expect(imported.spec.layers[0].useBias == false)
    }

    @Test(arguments: [(UInt16(0x0001), Float(5.960464477539063e-08)), (0x8000, -0.0), (0x7C00, .infinity), (0x3555, 0.333251953125), (0x0400, 6.103515625e-05)])
    func halfFloatConversion(bits: UInt16, value: Float) {
        #expect(HalfFloat.float(bits: bits) == value)
        #expect(HalfFloat.float(bits: bits).sign == value.sign)
    }

    @Test func layerNamesAreMadeValidForOrchard() throws {
        var layer = makeLayer("x", reads: "x", writes: "dense.out")  // the same as the input, and Core ML allows it
        var p = CoreML_Specification_InnerProductLayerParams()
        p.inputChannels = 4
        p.outputChannels = 2
        p.weights.floatValue = [1, 2, 3, 4, 5, 6, 7, 8]
        layer.innerProduct = p
        var relu = makeLayer("act.1", reads: "dense.out", writes: "y")
        relu.activation.reLu = CoreML_Specification_ActivationReLU()
        var model = self.model(with: layer)
        model.neuralNetwork.layers.append(relu)
        model.description_p.output[0].name = "y"
        let imported = try CoreMLImporter().importModel(from: model.serializedBytes())
        #expect(imported.spec.layers.map(\.name) == ["x_2", "act_1"])
        #expect(imported.spec.layers[1].inputs == ["x_2"])
        #expect(imported.spec.output == "act_1")
    }
}
