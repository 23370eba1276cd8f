import Foundation
import OrchardFormats
import OrchardML
import Testing

/// Evaluation (`lossSums`, `evaluationMetrics`, `evaluate`) checks its targets as training does, and reads a
/// cross-entropy model without a final softmax as logits: a held-out file that does not fit the model is an error,
/// never a trap or silently misaligned metrics.
@Suite struct EvaluationInputTests {
    /// A classifier of 3 inputs into 4 classes, with or without its final softmax.
    static func classifier(softmax: Bool) throws -> Model {
        var layers: [any Layer] = [Dense(units: 4, name: "out")]
        if softmax { layers.append(Softmax(name: "probabilities")) }
        return try Model(name: "c", inputs: [InputSpec(name: "input", shape: [3])], layers: layers, seed: 7)
    }

    static let inputs = Tensor(shape: [5, 3], scalars: (0..<15).map { Float($0 % 7) / 7 - 0.4 })
    static let labels: [Float] = [0, 3, 1, 2, 3]

    /// A sequence model: 4 steps of one feature into 3 classes per step.
    static func sequence() throws -> Model {
        try Model(
            name: "s", inputs: [InputSpec(name: "input", shape: [4, 1])],
            layers: [GRU(units: 2, returnSequences: true, name: "rnn"), Dense(units: 3, name: "out"), Softmax(name: "p")], seed: 3)
    }

    @Test func aModelWithoutASoftmaxIsEvaluatedOnItsLogits() throws {
        let logits = try Self.classifier(softmax: false)
        let probabilities = try Self.classifier(softmax: true)
        let data = try TensorDataset(input: Self.inputs, targets: Tensor(shape: [5, 1], scalars: Self.labels))
        let a = try logits.evaluationMetrics(on: data, loss: .crossEntropy)
        let b = try probabilities.evaluationMetrics(on: data, loss: .crossEntropy)
        // The same weights: the logits' log-sum-exp is the softmax's −log p.
        #expect(a.loss > 0 && abs(a.loss - b.loss) <= 1e-6 * b.loss)
        #expect(a.values["accuracy"] == b.values["accuracy"])
        // By hand, from the raw outputs.
        let raw = try logits(Self.inputs).scalars
        var expected = 0.0
        for (j, label) in Self.labels.enumerated() {
            let row = raw[(j * 4)..<(j * 4 + 4)].map(Double.init)
            let m = row.max()!
            expected += log(row.reduce(0) { $0 + exp($1 - m) }) + m - row[Int(label)]
        }
        #expect(abs(a.loss - expected / 5) <= 1e-6 * expected / 5)
    }

    @Test func targetsOfTheWrongShapeAreAShapeMismatch() throws {
        let model = try Self.classifier(softmax: true)
        // Two values per sample for a classifier.
        let wide = try TensorDataset(input: Self.inputs, targets: Tensor(shape: [5, 2], scalars: Array(repeating: 1, count: 10)))
        #expect { try model.evaluationMetrics(on: wide, loss: .crossEntropy) } throws: { ($0 as? EngineError)?.code == .shapeMismatch }
        // A regression target per sample where the output has four values.
        #expect { try model.evaluate(on: wide, loss: .meanSquaredError) } throws: { ($0 as? EngineError)?.code == .shapeMismatch }
        // A sequence model (4 positions) given one target per sample: this used to read past the targets and trap.
        let sequence = try Self.sequence()
        let x = Tensor(shape: [3, 4, 1], scalars: (0..<12).map { Float($0) / 12 })
        let short = try TensorDataset(input: x, targets: Tensor(shape: [3, 1], scalars: [0, 1, 2]))
        #expect { try sequence.evaluationMetrics(on: short, loss: .crossEntropy) } throws: { ($0 as? EngineError)?.code == .shapeMismatch }
        let fitting = try TensorDataset(input: x, targets: Tensor(shape: [3, 4], scalars: [0, 1, 2, -1, 2, 2, 1, 0, 1, -1, -1, -1]))
        let metrics = try sequence.evaluationMetrics(on: fitting, loss: .crossEntropy)
        // Eight positions are not padding: the count travels with the metrics (a classifier has none).
        #expect(metrics.values["perplexity"] != nil && metrics.positions == 8 && metrics.all["positions"] == 8)
        let classifier = try TensorDataset(input: Self.inputs, targets: Tensor(shape: [5, 1], scalars: Self.labels))
        #expect(try model.evaluationMetrics(on: classifier, loss: .crossEntropy).positions == nil)
    }

    @Test func targetsThatAreNoClassOrNotFiniteAreRefused() throws {
        let model = try Self.classifier(softmax: true)
        for bad: Float in [.nan, .infinity, -.infinity, 1e20, -1, 4, 1.5] {
            var labels = Self.labels
            labels[3] = bad
            let data = try TensorDataset(input: Self.inputs, targets: Tensor(shape: [5, 1], scalars: labels))
            #expect("\(bad)") { try model.evaluationMetrics(on: data, loss: .crossEntropy) } throws: {
                ($0 as? EngineError)?.code == .invalidArgument && "\($0)".contains("sample 3")
            }
        }
        // −1 marks padding in a sequence only.
        let sequence = try Self.sequence()
        let x = Tensor(shape: [1, 4, 1], scalars: [0.1, 0.2, 0.3, 0.4])
        let padded = try TensorDataset(input: x, targets: Tensor(shape: [1, 4], scalars: [2, -1, -1, -1]))
        #expect(try sequence.lossSums(on: padded, targets: [2, -1, -1, -1], loss: .crossEntropy).positions == 1)
        #expect { try sequence.lossSums(on: padded, targets: [2, -2, -1, -1], loss: .crossEntropy) } throws: {
            ($0 as? EngineError)?.code == .invalidArgument
        }
        // A regression target that is not finite.
        let regressor = try Model(name: "r", inputs: [InputSpec(name: "input", shape: [3])], layers: [Dense(units: 1)], seed: 1)
        let nan = try TensorDataset(input: Self.inputs, targets: Tensor(shape: [5, 1], scalars: [1, 2, .nan, 3, 4]))
        #expect { try regressor.evaluationMetrics(on: nan, loss: .meanSquaredError) } throws: { ($0 as? EngineError)?.code == .invalidArgument }
    }
}
