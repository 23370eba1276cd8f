import Foundation
import OrchardFormats
import Testing

@Suite struct ModelSpecTests {
    static let housing = ModelSpec(
        name: "housing",
        inputs: [
            InputSpec(name: "numeric", shape: [11]),
            InputSpec(name: "chas", shape: [1], categorical: true),
            InputSpec(name: "rad", shape: [1], categorical: true),
        ],
        layers: [
            LayerSpec(name: "chasEmbedding", type: .embedding, inputs: ["chas"], frozen: true, vocabularySize: 2, embeddingSize: 2),
            LayerSpec(name: "radEmbedding", type: .embedding, inputs: ["rad"], frozen: true, vocabularySize: 9, embeddingSize: 5),
            LayerSpec(name: "joined", type: .concat, inputs: ["numeric", "chasEmbedding", "radEmbedding"]),
            LayerSpec(name: "dense1", type: .dense, inputs: ["joined"], units: 64),
            LayerSpec(name: "relu1", type: .relu, inputs: ["dense1"]),
            LayerSpec(name: "out", type: .dense, inputs: ["relu1"], units: 1),
        ],
        training: TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.01, momentum: 0.9), epochs: 5, batchSize: 16)
    )

    @Test func jsonRoundTripIsLosslessAndStable() throws {
        let json = try Self.housing.jsonData()
        let decoded = try ModelSpec.decode(json: json)
        #expect(decoded == Self.housing)
        #expect(try decoded.jsonData() == json)
    }

    @Test func jsonKeysAreSnakeCaseInFormatVersion2() throws {
        let text = String(decoding: try Self.housing.jsonData(), as: UTF8.self)
        #expect(ModelSpec.currentFormatVersion == 2)
        for key in ["\"format_version\" : 2", "\"vocabulary_size\"", "\"embedding_size\"", "\"learning_rate\"", "\"weight_decay\"", "\"batch_size\""] {
            #expect(text.contains(key), "\(key) missing from \(text)")
        }
        // No key of the written JSON has an upper-case letter (values such as layer names may).
        let object = try JSONSerialization.jsonObject(with: try Self.housing.jsonData())
        func keys(_ any: Any) -> [String] {
            if let dictionary = any as? [String: Any] { return dictionary.keys.map { $0 } + dictionary.values.flatMap(keys) }
            if let array = any as? [Any] { return array.flatMap(keys) }
            return []
        }
        let camel = keys(object).filter { $0.contains { $0.isUppercase } }
        #expect(camel.isEmpty, "camelCase keys: \(camel)")
    }

    @Test func formatVersion1WithCamelCaseKeysIsStillRead() throws {
        let json = String(decoding: try Self.housing.jsonData(), as: UTF8.self)
        var version1 = json.replacingOccurrences(of: "\"format_version\" : 2", with: "\"formatVersion\" : 1")
        for (snake, camel) in [("vocabulary_size", "vocabularySize"), ("embedding_size", "embeddingSize"), ("learning_rate", "learningRate"),
                               ("weight_decay", "weightDecay"), ("batch_size", "batchSize")] {
            version1 = version1.replacingOccurrences(of: "\"\(snake)\"", with: "\"\(camel)\"")
        }
        #expect(version1 != json)
        let decoded = try ModelSpec.decode(json: Data(version1.utf8))
        #expect(decoded == Self.housing)
        #expect(decoded.formatVersion == 2)
        #expect(try decoded.jsonData() == Self.housing.jsonData())
    }

    @Test(arguments: [
        (#"{"format_version":3,"name":"x","inputs":[],"layers":[],"output":"a"}"#, "format version 3 is not supported"),
        (#"{"format_version":1,"name":"x","inputs":[],"layers":[],"output":"a"}"#, "format version 1 is not supported"),
        (#"{"formatVersion":2,"name":"x","inputs":[],"layers":[],"output":"a"}"#, "format version 2 is not supported"),
        (#"{"name":"x","inputs":[],"layers":[],"output":"a"}"#, "format_version"),
        (#"{"format_version":2,"name":"x","inputs":[{"name":"i","shape":[1],"categorical":false}],"layers":[{"name":"d","type":"dense","inputs":["i"],"units":1}],"output":"d","training":{"loss":"mse","optimizer":{"type":"sgd"},"epochs":1,"batch_size":1}}"#, "learning_rate"),
    ])
    func unreadableVersionsAndMissingKeysAreNamed(json: String, expected: String) {
        let error = #expect(throws: FormatError.self) { try ModelSpec.decode(json: Data(json.utf8)) }
        #expect(error?.code == .invalidSpec)
        #expect(error?.message.contains(expected) == true, "\(error?.message ?? "no error")")
    }

    @Test func paddingCodesAsStringOrPair() throws {
        let values: [Padding] = [.valid, .same, .explicit(height: 1, width: 2)]
        let data = try JSONEncoder().encode(values)
        #expect(String(decoding: data, as: UTF8.self) == #"["valid","same",[1,2]]"#)
        #expect(try JSONDecoder().decode([Padding].self, from: data) == values)
        #expect(throws: (any Error).self) { try JSONDecoder().decode([Padding].self, from: Data(#"["full"]"#.utf8)) }
    }

    @Test(arguments: [
        (28, 3, 1, 28, 1), (28, 3, 2, 14, 0), (5, 2, 2, 3, 0), (7, 4, 1, 7, 1),
    ])
    func samePaddingFollowsTensorFlowsRule(input: Int, kernel: Int, stride: Int, output: Int, before: Int) {
        let r = Padding.same.resolve(input: input, kernel: kernel, stride: stride, axis: 0)
        #expect(r.output == output)
        #expect(r.padBefore == before)
    }

    @Test func invalidSpecsNameTheProblem() {
        var spec = Self.housing
        spec.layers[3].inputs = ["nowhere"]
        #expect(throws: FormatError.self) { try spec.validate() }

        spec = Self.housing
        spec.layers[4].name = "dense1"
        #expect(throws: FormatError.self) { try spec.validate() }

        spec = Self.housing
        spec.output = "missing"
        #expect(throws: FormatError.self) { try spec.validate() }

        spec = Self.housing
        spec.layers[3].inputs = ["numeric", "chas"]
        #expect(throws: FormatError.self) { try spec.validate() }

        do {
            _ = try ModelSpec.decode(json: Data(#"{"formatVersion":1,"name":"x","inputs":[],"layers":[{"name":"a"}],"output":"a"}"#.utf8))
            Issue.record("expected an error")
        } catch {
            #expect(error.code == .invalidSpec)
            #expect(error.message.contains("type"))
        }
    }
}
