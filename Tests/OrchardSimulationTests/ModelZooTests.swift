import OrchardSupport
import Foundation
import OrchardFormats
import OrchardML
import OrchardSimulation
import Testing

@Suite struct ModelZooTests {
    /// PyTorch's default for `nn.Linear`/`nn.Conv2d`: weights and biases uniform in ±1/√fanIn.
    @Test(arguments: ["mlp2nn", "cnn"])
    func pyTorchInitialisationDrawsWeightsAndBiasesInsideTheFanInBound(name: String) throws {
        let spec = name == "cnn" ? ModelZoo.cnn(imageShape: [1, 28, 28]) : ModelZoo.mlp2nn(imageShape: [1, 28, 28])
        var model = try Model(spec: spec, seed: 3)
        try ModelZoo.initializeAsPyTorch(&model, seed: 3)
        let fanIns: [String: Int] =
            name == "cnn"
            ? ["conv1": 25, "conv2": 32 * 25, "hidden": 64 * 7 * 7, "logits": 512]
            : ["hidden1": 784, "hidden2": 200, "logits": 200]
        for (layer, fanIn) in fanIns {
            let bound = 1 / Float(fanIn).squareRoot()
            for suffix in ["weight", "bias"] {
                let values = try #require(model.parameter("\(layer).\(suffix)")).scalars
                let largest = values.map(abs).max() ?? 0
                #expect(largest <= bound, "\(layer).\(suffix) exceeds ±1/√\(fanIn)")
                #expect(values.contains { $0 != 0 }, "\(layer).\(suffix) was left at zero")
                guard suffix == "weight" else { continue }
                // Thousands of draws: uniform over the whole interval, centred on zero.
                #expect(largest > 0.99 * bound, "\(layer).weight does not fill ±1/√\(fanIn)")
                let mean = values.reduce(0, +) / Float(values.count)
                #expect(abs(mean) < 0.1 * bound)
            }
        }
    }

    @Test func pyTorchInitialisationIsSeeded() throws {
        let spec = ModelZoo.mlp2nn(imageShape: [1, 28, 28])
        var a = try Model(spec: spec, seed: 1), b = try Model(spec: spec, seed: 1), c = try Model(spec: spec, seed: 1)
        try ModelZoo.initializeAsPyTorch(&a, seed: 7)
        try ModelZoo.initializeAsPyTorch(&b, seed: 7)
        try ModelZoo.initializeAsPyTorch(&c, seed: 8)
        #expect(a.flatParameters() == b.flatParameters())
        #expect(a.flatParameters() != c.flatParameters())
    }
}

@Suite struct EvaluationTests {
    /// A seeded classification problem: 103 random 1×4×4 images, labels 0..<10.
    static func data(seed: UInt64) throws -> TensorDataset {
        var random = OrchardRandom(seed: seed)
        let n = 103
        let images = (0..<(n * 16)).map { _ in random.nextFloat() }
        let labels = (0..<n).map { _ in Float(random.nextInt(below: 10)) }
        return try TensorDataset(inputs: ["image": Tensor(shape: [n, 1, 4, 4], scalars: images)], targets: Tensor(shape: [n, 1], scalars: labels))
    }

    @Test(arguments: [1, 2, 3, 7])
    func evaluationInPartsMatchesTheEngine(parts: Int) async throws {
        let test = try Self.data(seed: 5)
        let model = try Model(spec: ModelZoo.mlp2nn(imageShape: [1, 4, 4]), seed: 2)
        let workload = EngineWorkload(model: model, slices: [test], testSet: test, evaluationParallelism: parts)
        let evaluation = try await workload.evaluate(model: model.weightsSafetensors())
        #expect(evaluation.accuracy == (try model.accuracy(on: test)))
        // Cross-entropy from the engine's own probabilities, one sample at a time.
        let probabilities = try model.predict(test).scalars
        var expected = 0.0
        for j in 0..<test.count {
            var label: Float = 0
            withUnsafeMutablePointer(to: &label) { test.copyTarget(of: j, into: UnsafeMutableBufferPointer(start: $0, count: 1)) }
            expected -= Foundation.log(Double(probabilities[j * 10 + Int(label)]))
        }
        #expect(abs(evaluation.loss - expected / Double(test.count)) < 1e-5)
    }
}
