import Foundation
import OrchardFormats
import OrchardML
import Testing

@Suite struct ModelTests {
    /// The housing model written as architecture JSON, the way a server ships it.
    static let housingJSON = """
        {
          "format_version": 2, "name": "housing", "output": "out",
          "inputs": [
            {"name": "numeric", "shape": [10], "categorical": false},
            {"name": "chas", "shape": [1], "categorical": true},
            {"name": "rad", "shape": [1], "categorical": true}
          ],
          "layers": [
            {"name": "chasEmbedding", "type": "embedding", "inputs": ["chas"], "frozen": true, "vocabulary_size": 2, "embedding_size": 2},
            {"name": "radEmbedding", "type": "embedding", "inputs": ["rad"], "frozen": true, "vocabulary_size": 9, "embedding_size": 5},
            {"name": "features", "type": "concat", "inputs": ["numeric", "chasEmbedding", "radEmbedding"]},
            {"name": "dense1", "type": "dense", "inputs": ["features"], "units": 64},
            {"name": "relu1", "type": "relu", "inputs": ["dense1"]},
            {"name": "dense2", "type": "dense", "inputs": ["relu1"], "units": 32},
            {"name": "relu2", "type": "relu", "inputs": ["dense2"]},
            {"name": "out", "type": "dense", "inputs": ["relu2"], "units": 1}
          ],
          "training": {"loss": "mse", "optimizer": {"type": "sgd", "learning_rate": 0.01}, "epochs": 5, "batch_size": 16}
        }
        """

    @Test func architectureParameterShapesMatchTheBuiltModel() throws {
        let convolutional = ModelSpec(
            name: "digits", inputs: [InputSpec(name: "image", shape: [1, 12, 12])],
            layers: [
                LayerSpec(name: "conv1", type: .conv2d, inputs: ["image"], units: 4, kernelSize: [3, 3], strides: [2, 2], padding: .same),
                LayerSpec(name: "act1", type: .relu, inputs: ["conv1"]),
                LayerSpec(
                    name: "conv2", type: .conv2d, inputs: ["act1"], units: 6, useBias: false, kernelSize: [3, 3], padding: .explicit(height: 1, width: 1)),
                LayerSpec(name: "pool", type: .maxPool2d, inputs: ["conv2"], kernelSize: [2, 2]),
                LayerSpec(name: "drop", type: .dropout, inputs: ["pool"], rate: 0.25),
                LayerSpec(name: "flat", type: .flatten, inputs: ["drop"]),
                LayerSpec(name: "fc", type: .dense, inputs: ["flat"], units: 3),
                LayerSpec(name: "probs", type: .softmax, inputs: ["fc"]),
            ]
        )
        for spec in [try ModelSpec.decode(json: Data(Self.housingJSON.utf8)), convolutional] {
            let derived = try spec.parameters()
            let built = try Model(spec: spec, seed: 1).parameterShapes
            #expect(Dictionary(uniqueKeysWithValues: derived.map { ($0.name, $0.shape) }) == built, "\(spec.name)")
            try spec.checkWeights(built)
        }
    }

    @Test func housingModelBuildsFromJSONWithDocumentedLayouts() throws {
        let spec = try ModelSpec.decode(json: Data(Self.housingJSON.utf8))
        let model = try Model(spec: spec, seed: 3)
        #expect(model.outputShape == [1])
        #expect(model.shapes["features"] == [17])
        #expect(
            model.parameterShapes == [
                "chasEmbedding.weight": [2, 2], "radEmbedding.weight": [9, 5],
                "dense1.weight": [64, 17], "dense1.bias": [64], "dense2.weight": [32, 64], "dense2.bias": [32],
                "out.weight": [1, 32], "out.bias": [1],
            ])
        #expect(model.trainableParameterNames == ["dense1.bias", "dense1.weight", "dense2.bias", "dense2.weight", "out.bias", "out.weight"])
        // The spec the model gives back rebuilds the same architecture, with inferred sizes filled in.
        let again = try Model(spec: try ModelSpec.decode(json: try model.spec.jsonData()), seed: 3)
        #expect(again.spec == model.spec)
        #expect(again.flatParameters() == model.flatParameters())
        #expect(model.spec.layers[3].inputSize == 17)
        #expect(model.training?.optimizer.learningRate == 0.01)
    }

    @Test func dslClassicAPIAndJSONBuildTheSameHousingModel() throws {
        let dsl = try Fixtures.housingModel(seed: 7)
        let classic = try Model(
            name: "housing",
            inputs: [
                InputSpec(name: "numeric", shape: [10]), InputSpec(name: "chas", shape: [1], categorical: true),
                InputSpec(name: "rad", shape: [1], categorical: true),
            ],
            layers: [
                Embedding(vocabularySize: 2, embeddingSize: 2, name: "chasEmbedding", inputs: ["chas"], frozen: true),
                Embedding(vocabularySize: 9, embeddingSize: 5, name: "radEmbedding", inputs: ["rad"], frozen: true),
                Concat(name: "features", inputs: ["numeric", "chasEmbedding", "radEmbedding"]),
                Dense(units: 64), ReLU(), Dense(units: 32), ReLU(), Dense(units: 1),
            ],
            seed: 7
        )
        let fromJSON = try Model(spec: dsl.spec, seed: 7)
        #expect(classic.spec == dsl.spec)
        #expect(fromJSON.spec == dsl.spec)
        #expect(classic.flatParameters() == dsl.flatParameters())
        #expect(dsl.layers.map(\.name) == ["chasEmbedding", "radEmbedding", "features", "dense1", "relu1", "dense2", "relu2", "dense3"])
    }

    @Test func inferenceMatchesAHandComputedDenseLayer() throws {
        let model = try Model(
            name: "tiny", inputs: [InputSpec(name: "x", shape: [2])],
            layers: [
                Dense(weight: Tensor(rows: [[1, 2], [-1, 0.5]]), bias: Tensor(shape: [2], scalars: [0.5, -1])),
                ReLU(),
            ])
        let y = try model(Tensor(rows: [[1, 1], [2, -2]]))
        // Row 1: [1+2+0.5, -1+0.5-1] = [3.5, -1.5] → relu [3.5, 0]; row 2: [2-4+0.5, -2-1-1] → [0, 0].
        #expect(y.scalars == [3.5, 0, 0, 0])
    }

    @Test(arguments: [
        (
            "{\"format_version\":2,\"name\":\"m\",\"inputs\":[{\"name\":\"x\",\"shape\":[4],\"categorical\":false}],\"layers\":[{\"name\":\"d\",\"type\":\"dense\",\"inputs\":[\"x\"]}],\"output\":\"d\"}",
            "'units'"
        ),
        (
            "{\"format_version\":2,\"name\":\"m\",\"inputs\":[{\"name\":\"x\",\"shape\":[4],\"categorical\":false}],\"layers\":[{\"name\":\"e\",\"type\":\"embedding\",\"inputs\":[\"x\"],\"vocabulary_size\":3,\"embedding_size\":2}],\"output\":\"e\"}",
            "not categorical"
        ),
        (
            "{\"format_version\":2,\"name\":\"m\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"categorical\":false}],\"layers\":[{\"name\":\"r\",\"type\":\"reshape\",\"inputs\":[\"x\"],\"target_shape\":[4]}],\"output\":\"r\"}",
            "does not hold"
        ),
        (
            "{\"format_version\":2,\"name\":\"m\",\"inputs\":[{\"name\":\"x\",\"shape\":[1,4,4],\"categorical\":false}],\"layers\":[{\"name\":\"c\",\"type\":\"conv2d\",\"inputs\":[\"x\"],\"units\":2,\"kernel_size\":[5,5]}],\"output\":\"c\"}",
            "does not fit"
        ),
    ])
    func invalidArchitecturesFailWithAClearMessage(json: String, fragment: String) throws {
        // Refused when the file is read (its shapes are inferred there), or else when the engine builds it.
        let message: String
        do {
            let spec = try ModelSpec.decode(json: Data(json.utf8))
            let error = #expect(throws: EngineError.self) { try Model(spec: spec) }
            #expect(error?.code == .invalidModel)
            message = error?.message ?? ""
        } catch {
            #expect(error.code == .invalidSpec)
            message = error.message
        }
        #expect(message.contains(fragment), "\(message)")
    }

    @Test func unknownLayerTypesAreRefusedByTheSpecAndTheEngine() throws {
        let json =
            "{\"format_version\":2,\"name\":\"m\",\"inputs\":[{\"name\":\"x\",\"shape\":[4],\"categorical\":false}],\"layers\":[{\"name\":\"q\",\"type\":\"quantum\",\"inputs\":[\"x\"]}],\"output\":\"q\"}"
        let decodeError = #expect(throws: FormatError.self) { try ModelSpec.decode(json: Data(json.utf8)) }
        #expect(decodeError?.message.contains("layer 'q' has unknown type 'quantum'") == true)
        let spec = ModelSpec(
            name: "m", inputs: [InputSpec(name: "x", shape: [4])], layers: [LayerSpec(name: "q", type: LayerType(rawValue: "quantum"), inputs: ["x"])])
        let engineError = #expect(throws: EngineError.self) { try Model(spec: spec) }
        #expect(engineError?.message.contains("unknown type") == true)
    }

    /// A spec built in code with sizes past the limits is refused by the engine before a layer multiplies them (a
    /// flatten of [2²⁴, 2²⁴, 2²⁴] overflowed Int and trapped).
    @Test func aSpecPastTheSizeLimitsIsRefusedBeforeItsLayersAreBuilt() {
        let spec = ModelSpec(
            name: "m", inputs: [InputSpec(name: "x", shape: [1 << 24, 1 << 24, 1 << 24])],
            layers: [LayerSpec(name: "f", type: .flatten, inputs: ["x"])])
        let error = #expect(throws: EngineError.self) { try Model(spec: spec) }
        #expect(error?.message.contains("elements") == true, "\(String(describing: error))")
        let wide = ModelSpec(
            name: "m", inputs: [InputSpec(name: "x", shape: [4])], layers: [LayerSpec(name: "d", type: .dense, inputs: ["x"], units: 1 << 40)])
        #expect(throws: EngineError.self) { try Model(spec: wide) }
    }

    @Test func parametersAreAddressableByNameAndAsAFlatVector() throws {
        var model = try Fixtures.housingModel()
        let flat = model.flatParameters()
        #expect(flat.count == model.parameterCount)
        #expect(flat.count == 2 * 2 + 9 * 5 + 64 * 17 + 64 + 32 * 64 + 32 + 32 + 1)
        // Flat order is by name: chasEmbedding.weight comes first.
        #expect(Array(flat.prefix(4)) == model.parameter("chasEmbedding.weight")!.scalars)
        try model.setFlatParameters(flat.map { $0 * 2 })
        #expect(model.parameter("chasEmbedding.weight")!.scalars == Array(flat.prefix(4)).map { $0 * 2 })
        #expect(throws: EngineError.self) { try model.setFlatParameters([1, 2, 3]) }
        #expect(throws: EngineError.self) { try model.setParameter("dense1.weight", to: Tensor(shape: [3, 3])) }
        #expect(throws: EngineError.self) { try model.setParameter("nothing.weight", to: Tensor(shape: [1])) }
    }

    @Test func diffAndApplyRoundTrip() throws {
        let original = try Fixtures.housingModel()
        let trainer = try Trainer(model: original, configuration: TrainingConfiguration(optimizer: .sgd(learningRate: 0.05), epochs: 1, batchSize: 8))
        let trained = try trainer.train(on: try Fixtures.housingData()).model
        let diff = try Model.diff(original: original, trained: trained)
        #expect(diff.norm > 0)
        #expect(diff.deltas["chasEmbedding.weight"]!.scalars.allSatisfy { $0 == 0 })
        var rebuilt = original
        try rebuilt.apply(diff)
        for (a, b) in zip(rebuilt.flatParameters(), trained.flatParameters()) { #expect(abs(a - b) <= 1e-6 * max(1, abs(b))) }
        var half = original
        try half.apply(ParameterDiff(records: diff.records), scale: 0.5)
        let w0 = original.parameter("dense3.bias")![0], w1 = trained.parameter("dense3.bias")![0]
        #expect(abs(half.parameter("dense3.bias")![0] - (w0 + (w1 - w0) / 2)) < 1e-6)
        var other = try Model(name: "x", inputShape: [3]) { Dense(units: 1) }
        #expect(throws: EngineError.self) { try other.apply(diff) }
    }
}
