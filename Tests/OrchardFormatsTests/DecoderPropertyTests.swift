import Foundation
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// Generators over the fuzz inputs of `OrchardTesting` (seeded by `propertyCheck`).
enum FormatGen {
    /// Arbitrary bytes, at most 2 KiB.
    static let bytes = fuzzed { Fuzz.bytes(using: &$0) }

    /// Random tensors (unique names, shapes of rank 0–3, finite values) with random metadata.
    static let archive = fuzzed { randomArchive(using: &$0) }

    static func randomArchive(using rng: inout SplitMix64) -> SafetensorsArchive {
        var tensors: [TensorRecord] = []
        for index in 0..<Int.random(in: 0...4, using: &rng) {
            let shape = (0..<Int.random(in: 0...3, using: &rng)).map { _ in Int.random(in: 0...4, using: &rng) }
            let count = shape.reduce(1, *)
            tensors.append(
                TensorRecord(
                    name: "t\(index).\(Fuzz.string(using: &rng))", shape: shape, values: (0..<count).map { _ in Float.random(in: -10...10, using: &rng) }))
        }
        var metadata: [String: String] = [:]
        for _ in 0..<Int.random(in: 0...2, using: &rng) { metadata[Fuzz.string(using: &rng)] = Fuzz.string(using: &rng) }
        return SafetensorsArchive(
            tensors: Dictionary(tensors.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a }).values.sorted { $0.name < $1.name }, metadata: metadata)
    }

    /// A valid file with 1–3 mutations of every kind.
    static let mutatedFile = fuzzed { rng in
        let base = randomArchive(using: &rng)
        var bytes = base.encoded()
        for _ in 0..<Int.random(in: 1...3, using: &rng) {
            bytes = SafetensorsMutation.allCases.randomElement(using: &rng)!.apply(to: bytes, using: &rng)
        }
        return bytes
    }
}

/// Checks what a successful index promises: contiguous tensors in offset order exactly covering the data, each
/// with as many bytes as its shape and dtype need.
private func expectConsistent(_ index: SafetensorsIndex, of bytes: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
    var cursor = index.entries.first?.byteRange.lowerBound ?? bytes.count
    for entry in index.entries {
        #expect(entry.byteRange.lowerBound == cursor, sourceLocation: sourceLocation)
        #expect(entry.count == entry.shape.reduce(1, *), sourceLocation: sourceLocation)
        #expect(entry.byteRange.count == entry.count * entry.dtype.byteCount, sourceLocation: sourceLocation)
        cursor = entry.byteRange.upperBound
    }
    #expect(cursor == bytes.count, sourceLocation: sourceLocation)
}

// The generators do not shrink; with shrinking off every issue is reported as it happens.
@Suite(.shrinking(false)) struct SafetensorsPropertyTests {
    @Test func encodingThenDecodingGivesBackEveryTensorAndTheMetadata() async {
        await propertyCheck(count: 200, input: FormatGen.archive) { archive in
            let decoded = try Safetensors.decode(archive.encoded())
            #expect(decoded.byName == archive.byName)
            #expect(decoded.metadata == archive.metadata)
        }
    }

    @Test func arbitraryBytesAreIndexedConsistentlyOrRefusedWithAFormatError() async {
        await propertyCheck(count: 500, input: FormatGen.bytes) { bytes in
            // `index` and `decode` throw only `FormatError` (typed throws); the property is that they return.
            if let index = try? Safetensors.index(bytes) { expectConsistent(index, of: bytes) }
            _ = try? Safetensors.decode(bytes, allowConversion: true)
        }
    }

    @Test func mutatedFilesAreIndexedConsistentlyOrRefusedWithAFormatError() async {
        var codes: Set<String> = []
        await propertyCheck(count: 1000, input: FormatGen.mutatedFile) { bytes in
            do throws(FormatError) {
                let index = try Safetensors.index(bytes)
                expectConsistent(index, of: bytes)
                let archive = try Safetensors.decode(bytes, allowConversion: true)
                #expect(archive.tensors.map(\.name) == index.entries.map(\.name))
            } catch {
                codes.insert(error.code.description)
            }
        }
        // The mutations reach the checks behind the JSON parser, not only the parser.
        #expect(codes.isSuperset(of: ["truncated", "invalid_header", "invalid_offsets"]), "\(codes.sorted())")
    }
}

@Suite(.shrinking(false)) struct ModelSpecPropertyTests {
    static let valid: JSONValue = {
        let spec = ModelSpec(
            name: "m", inputs: [InputSpec(name: "x", shape: [3]), InputSpec(name: "image", shape: [1, 4, 4])],
            layers: [
                LayerSpec(name: "dense", type: .dense, inputs: ["x"], units: 2, inputSize: 3),
                LayerSpec(name: "conv", type: .conv2d, inputs: ["image"], units: 2, kernelSize: [2, 2], strides: [1, 1], padding: .same, inChannels: 1),
                LayerSpec(name: "pool", type: .maxPool2d, inputs: ["conv"], kernelSize: [2, 2]),
                LayerSpec(name: "flat", type: .flatten, inputs: ["pool"]),
                LayerSpec(name: "join", type: .concat, inputs: ["dense", "flat"]),
                LayerSpec(name: "drop", type: .dropout, inputs: ["join"], rate: 0.1),
                LayerSpec(name: "out", type: .dense, inputs: ["drop"], units: 3),
                LayerSpec(name: "soft", type: .softmax, inputs: ["out"]),
            ],
            training: TrainingSpec(loss: .crossEntropy, optimizer: .adam(), epochs: 2, batchSize: 8, maxUpdates: 10)
        )
        return try! JSONValue.parse(spec.jsonData())
    }()

    /// Decodes, validates, checks the limits and derives the parameters; any failure must be a `FormatError`.
    private func exercise(_ json: [UInt8]) -> FormatError? {
        do throws(FormatError) {
            let spec = try ModelSpec.decode(json: Data(json))
            try spec.validateLimits()
            let parameters = try spec.parameters()
            #expect(parameters.allSatisfy { $0.shape.allSatisfy { $0 > 0 } && $0.shape.count == $0.fields.count })
            try spec.checkWeights(Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.shape) }))
            return nil
        } catch {
            return error
        }
    }

    @Test func theValidSpecPasses() {
        #expect(exercise(Fuzz.json(Self.valid)) == nil)
    }

    @Test func arbitraryJSONIsAFormatErrorNeverACrash() async {
        await propertyCheck(count: 500, input: fuzzed { Fuzz.value(depth: 4, using: &$0) }) { value in
            #expect(exercise(Fuzz.json(value))?.code == .invalidSpec)
        }
    }

    @Test func mutatedSpecsPassOrFailWithAFormatErrorNeverACrash() async {
        var outcomes: [String: Int] = [:]
        await propertyCheck(count: 1000, input: fuzzed { Fuzz.mutate(Self.valid, edits: 3, using: &$0) }) { value in
            let error = exercise(Fuzz.json(value))
            outcomes[error.map { $0.code.description } ?? "ok", default: 0] += 1
        }
        #expect(outcomes["invalid_spec", default: 0] > 0, "\(outcomes)")
    }

    @Test func hugeSizesAreRefusedNotOverflowed() throws {
        func spec(_ layers: [LayerSpec], shape: [Int]) -> ModelSpec { ModelSpec(name: "m", inputs: [InputSpec(name: "x", shape: shape)], layers: layers) }
        let cases: [ModelSpec] = [
            spec([LayerSpec(name: "f", type: .flatten, inputs: ["x"])], shape: [1 << 24, 1 << 24, 1 << 24]),
            spec([LayerSpec(name: "e", type: .embedding, inputs: ["x"], vocabularySize: 2, embeddingSize: 1 << 24)], shape: [1 << 24]),
            spec([LayerSpec(name: "d", type: .dense, inputs: ["x"], units: Int.max)], shape: [4]),
            spec(
                [LayerSpec(name: "c", type: .conv2d, inputs: ["x"], units: 1, kernelSize: [1, 1], padding: .explicit(height: Int.max, width: 0))],
                shape: [1, 2, 2]),
            spec([LayerSpec(name: "d", type: .dense, inputs: ["x"], units: 1 << 24)], shape: [1 << 24]),
        ]
        for model in cases {
            #expect(throws: FormatError.self) { try model.parameters() }
        }
    }

    @Test func trainingSettingsOutsideTheEnginesRangesAreRefused() {
        let base = ModelSpec(name: "m", inputs: [InputSpec(name: "x", shape: [2])], layers: [LayerSpec(name: "d", type: .dense, inputs: ["x"], units: 1)])
        let bad: [TrainingSpec] = [
            TrainingSpec(loss: LossType(rawValue: "hinge")),
            TrainingSpec(
                loss: .meanSquaredError,
                optimizer: OptimizerSpec(type: "rmsprop", learningRate: 0.1, momentum: 0, weightDecay: 0, beta1: 0.9, beta2: 0.99, epsilon: 1e-8)),
            TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0)),
            TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: .infinity)),
            TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(momentum: 1)),
            TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(weightDecay: -1)),
            TrainingSpec(loss: .meanSquaredError, optimizer: .adam(beta2: 1)),
            TrainingSpec(loss: .meanSquaredError, optimizer: .adam(epsilon: 0)),
            TrainingSpec(loss: .meanSquaredError, epochs: 0),
            TrainingSpec(loss: .meanSquaredError, epochs: ModelSpec.maximumEpochs + 1),
            TrainingSpec(loss: .meanSquaredError, batchSize: 0),
            TrainingSpec(loss: .meanSquaredError, batchSize: ModelSpec.maximumBatchSize + 1),
            TrainingSpec(loss: .meanSquaredError, maxUpdates: 0),
        ]
        for training in bad {
            var spec = base
            spec.training = training
            #expect(throws: FormatError.self, "\(training)") { try spec.validateLimits() }
        }
        var good = base
        good.training = TrainingSpec(
            loss: .meanSquaredError, optimizer: .adam(), epochs: ModelSpec.maximumEpochs, batchSize: ModelSpec.maximumBatchSize, maxUpdates: 1)
        #expect(throws: Never.self) { try good.validateLimits() }
    }
}
