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
