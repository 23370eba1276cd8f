import Foundation
import OrchardFlower
import OrchardFormats
import OrchardML
import OrchardSupport
import Testing

/// A recurrent model in a Flower federation: the arrays a PyTorch `nn.LSTM` + `nn.Linear` server sends, in
/// `state_dict()` order and named as PyTorch names them, load positionally into the Orchard model without reshaping,
/// train, and go back in the same order, names and shapes; an array in the wrong shape is refused, naming both.
@Suite struct RecurrentFlowerAppTests {
    static let spec = ModelSpec(
        name: "sensor-lstm", inputs: [InputSpec(name: "x", shape: [6, 2])],
        layers: [
            LayerSpec(name: "lstm", type: .lstm, inputs: ["x"], units: 4, inputSize: 2),
            LayerSpec(name: "out", type: .dense, inputs: ["lstm"], units: 3, inputSize: 4),
            LayerSpec(name: "p", type: .softmax, inputs: ["out"]),
        ],
        output: "p", training: TrainingSpec(loss: .crossEntropy, optimizer: .sgd(learningRate: 0.5), epochs: 2, batchSize: 4))

    /// What `state_dict()` lists for `nn.LSTM(2, 4, batch_first=True)` then `nn.Linear(4, 3)`.
    static func pytorchArrays(seed: UInt64) -> [NamedArray] {
        var random = OrchardRandom(seed: seed)
        return [
            ("lstm.weight_ih_l0", [16, 2]), ("lstm.weight_hh_l0", [16, 4]), ("lstm.bias_ih_l0", [16]), ("lstm.bias_hh_l0", [16]),
            ("fc.weight", [3, 4]), ("fc.bias", [3]),
        ].map { name, shape in NamedArray(name: name, shape: shape, values: (0..<shape.reduce(1, *)).map { _ in random.nextFloat(symmetric: 0.5) }) }
    }

    static func data() throws -> TensorDataset {
        var random = OrchardRandom(seed: 4)
        let x = Tensor(shape: [12, 6, 2], scalars: (0..<144).map { _ in random.nextFloat(symmetric: 1) })
        let y = Tensor(shape: [12, 1], scalars: (0..<12).map { Float($0 % 3) })
        return try TensorDataset(inputs: ["x": x], targets: y)
    }

    @Test func pytorchsArraysLoadPositionallyTrainAndComeBackInTheirOrder() throws {
        let app = try FlowerLocalApp(model: Self.spec, dataset: try Self.data())
        let sent = Self.pytorchArrays(seed: 9)
        let loaded = try app.load(sent)
        #expect(loaded.parameter("lstm.weight_ih")?.scalars == sent[0].values)
        #expect(loaded.parameter("lstm.weight_hh")?.scalars == sent[1].values)
        #expect(loaded.parameter("lstm.bias_ih")?.scalars == sent[2].values)
        #expect(loaded.parameter("lstm.bias_hh")?.scalars == sent[3].values)
        #expect(loaded.parameter("out.weight")?.scalars == sent[4].values)
        let (trained, metrics) = try app.train(sent, settings: RoundSettings(serverRound: 1))
        #expect(trained.map(\.name) == sent.map(\.name) && trained.map(\.shape) == sent.map(\.shape))
        #expect(zip(trained, sent).allSatisfy { $0.values != $1.values }, "every array trained")
        #expect(metrics["num-examples"] == 12)
        #expect(try app.evaluate(trained)["eval_acc"] != nil)
    }

    /// A model whose training section caps the updates inside the first epoch reports the examples it trained on, not
    /// the whole dataset: FedAvg weighs the reply by them.
    @Test func numExamplesCountsWhatWasTrainedOn() throws {
        var spec = Self.spec
        spec.training?.maxUpdates = 1
        spec.training?.batchSize = 4
        let app = try FlowerLocalApp(model: spec, dataset: try Self.data())
        #expect(try app.train(Self.pytorchArrays(seed: 9), settings: RoundSettings(serverRound: 1)).metrics["num-examples"] == 4)
    }

    @Test func anArrayInAnotherShapeIsRefusedNamingIt() throws {
        let app = try FlowerLocalApp(model: Self.spec, dataset: try Self.data())
        var sent = Self.pytorchArrays(seed: 9)
        sent.swapAt(0, 1)
        #expect {
            _ = try app.load(sent)
        } throws: { error in
            (error as? FlowerError)?.message.contains("lstm.weight_hh_l0") == true
        }
    }
}
