import OrchardSupport
import Foundation
import OrchardFormats
import OrchardML
import Testing

/// Small datasets the training tests share.
enum Fixtures {
    /// XOR as a two-class problem.
    static func xor() throws -> TensorDataset {
        try TensorDataset(
            input: Tensor(rows: [[0, 0], [0, 1], [1, 0], [1, 1]]),
            targets: Tensor(shape: [4, 1], scalars: [0, 1, 1, 0])
        )
    }

    /// `y = 3·x0 − 2·x1 + 0.5·x2 + 1` on seeded uniform inputs.
    static func linear(count: Int = 256, seed: UInt64 = 3) throws -> TensorDataset {
        var random = OrchardRandom(seed: seed)
        var xs: [Float] = [], ys: [Float] = []
        for _ in 0..<count {
            let x = (0..<3).map { _ in random.nextFloat(symmetric: 1) }
            xs += x
            ys.append(3 * x[0] - 2 * x[1] + 0.5 * x[2] + 1)
        }
        return try TensorDataset(input: Tensor(shape: [count, 3], scalars: xs), targets: Tensor(shape: [count, 1], scalars: ys))
    }

    /// The housing model's shape: a numeric input and two categorical inputs through frozen embeddings.
    static func housingModel(seed: UInt64 = 1, frozenEmbeddings: Bool = true) throws -> Model {
        try Model(
            name: "housing",
            inputs: [
                InputSpec(name: "numeric", shape: [10]),
                InputSpec(name: "chas", shape: [1], categorical: true),
                InputSpec(name: "rad", shape: [1], categorical: true),
            ],
            seed: seed
        ) {
            Embedding(vocabularySize: 2, embeddingSize: 2, name: "chasEmbedding", inputs: ["chas"], frozen: frozenEmbeddings)
            Embedding(vocabularySize: 9, embeddingSize: 5, name: "radEmbedding", inputs: ["rad"], frozen: frozenEmbeddings)
            Concat(name: "features", inputs: ["numeric", "chasEmbedding", "radEmbedding"])
            Dense(units: 64)
            ReLU()
            Dense(units: 32)
            ReLU()
            Dense(units: 1)
        }
    }

    /// Synthetic housing-like data for ``housingModel(seed:frozenEmbeddings:)``.
    static func housingData(count: Int = 96, seed: UInt64 = 5) throws -> TensorDataset {
        var random = OrchardRandom(seed: seed)
        var numeric: [Float] = [], chas: [Float] = [], rad: [Float] = [], y: [Float] = []
        for _ in 0..<count {
            let x = (0..<10).map { _ in random.nextFloat(symmetric: 1) }
            let c = Float(random.nextInt(below: 2)), r = Float(random.nextInt(below: 9))
            numeric += x
            chas.append(c)
            rad.append(r)
            y.append(x[0] * 2 - x[3] + 0.5 * c + 0.1 * r)
        }
        return try TensorDataset(
            inputs: [
                "numeric": Tensor(shape: [count, 10], scalars: numeric),
                "chas": Tensor(shape: [count, 1], scalars: chas),
                "rad": Tensor(shape: [count, 1], scalars: rad),
            ],
            targets: Tensor(shape: [count, 1], scalars: y)
        )
    }
}

@Suite struct TrainingTests {
    @Test func xorConvergesWithCrossEntropyAndAdam() throws {
        let model = try Model(name: "xor", inputShape: [2], seed: 11) {
            Dense(units: 16)
            Tanh()
            Dense(units: 2)
            Softmax()
        }
        let data = try Fixtures.xor()
        let trainer = try Trainer(
            model: model,
            configuration: TrainingConfiguration(
                loss: .crossEntropy, optimizer: .adam(learningRate: 0.05), epochs: 300, batchSize: 4, seed: 1
            ))
        guard case .completed(let report) = try trainer.train(on: data) else {
            Issue.record("training was interrupted")
            return
        }
        #expect(report.epochs.count == 300)
        #expect(report.epochs.last!.loss < 0.05)
        #expect(report.epochs.last!.loss < report.epochs.first!.loss)
        #expect(try report.model.accuracy(on: data) == 1)
        let probabilities = try report.model(Tensor(rows: [[0, 1], [1, 1]]))
        #expect(probabilities[0, 1] > 0.9 && probabilities[1, 0] > 0.9)
    }

    @Test func linearRegressionRecoversItsCoefficientsWithMomentumSGD() throws {
        let model = try Model(name: "linear", inputShape: [3], seed: 2) { Dense(units: 1) }
        let data = try Fixtures.linear()
        let trainer = try Trainer(
            model: model,
            configuration: TrainingConfiguration(
                loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.05, momentum: 0.9), epochs: 60, batchSize: 16, seed: 4
            ))
        let trained = try trainer.train(on: data).model
        let w = try #require(trained.parameter("dense1.weight"))
        let b = try #require(trained.parameter("dense1.bias"))
        #expect(abs(w[0, 0] - 3) < 0.01 && abs(w[0, 1] + 2) < 0.01 && abs(w[0, 2] - 0.5) < 0.01)
        #expect(abs(b[0] - 1) < 0.01)
        #expect(try trained.rootMeanSquaredError(on: data) < 0.01)
        #expect(try trained.meanAbsoluteError(on: data) < 0.01)
    }

    @Test func housingModelTrainsWithFrozenEmbeddingsUntouched() throws {
        let model = try Fixtures.housingModel()
        let data = try Fixtures.housingData()
        let before = try model.rootMeanSquaredError(on: data)
        let trainer = try Trainer(
            model: model,
            configuration: TrainingConfiguration(
                loss: .meanSquaredError, optimizer: .adam(learningRate: 0.01), epochs: 40, batchSize: 16, seed: 9
            ))
        let trained = try trainer.train(on: data).model
        #expect(try trained.rootMeanSquaredError(on: data) < before / 3)
        #expect(trained.parameter("chasEmbedding.weight") == model.parameter("chasEmbedding.weight"))
        #expect(trained.parameter("radEmbedding.weight") == model.parameter("radEmbedding.weight"))
        #expect(trained.parameter("dense1.weight") != model.parameter("dense1.weight"))
        // Nothing upstream of the embeddings trains, so no gradient reaches them.
        #expect(trainer.plan.flatGradients()[trainer.plan.parameterOffsets["chasEmbedding.weight"]!] == 0)
    }

    @Test func unfrozenEmbeddingsLearn() throws {
        let model = try Fixtures.housingModel(frozenEmbeddings: false)
        let trainer = try Trainer(model: model, configuration: TrainingConfiguration(optimizer: .sgd(learningRate: 0.01), epochs: 2, batchSize: 8))
        let trained = try trainer.train(on: try Fixtures.housingData()).model
        #expect(trained.parameter("radEmbedding.weight") != model.parameter("radEmbedding.weight"))
    }

    @Test func fixedSeedGivesBitIdenticalWeights() throws {
        func run() throws -> [Float] {
            let model = try Fixtures.housingModel(seed: 21)
            let trainer = try Trainer(
                model: model, configuration: TrainingConfiguration(optimizer: .sgd(learningRate: 0.01, momentum: 0.9), epochs: 3, batchSize: 10, seed: 8))
            return try trainer.train(on: try Fixtures.housingData()).model.flatParameters()
        }
        let a = try run(), b = try run()
        #expect(a.map(\.bitPattern) == b.map(\.bitPattern))
        let other = try Trainer(
            model: try Fixtures.housingModel(seed: 21),
            configuration: TrainingConfiguration(optimizer: .sgd(learningRate: 0.01, momentum: 0.9), epochs: 3, batchSize: 10, seed: 9))
        #expect(try other.train(on: try Fixtures.housingData()).model.flatParameters() != a)
    }

    @Test func maxUpdatesCapsTraining() throws {
        let trainer = try Trainer(model: try Fixtures.housingModel(), configuration: TrainingConfiguration(epochs: 5, batchSize: 10, maxUpdates: 13))
        guard case .completed(let report) = try trainer.train(on: try Fixtures.housingData()) else {
            Issue.record("training was interrupted")
            return
        }
        #expect(report.updates == 13)
        // 96 samples in batches of 10 is 10 updates per epoch: one full epoch, then 3 updates of the next.
        #expect(report.epochs.map(\.updates) == [10, 3])
        #expect(report.epochs.map(\.samples) == [96, 30])
    }

    @Test func mismatchedDatasetIsAClearError() throws {
        let trainer = try Trainer(model: try Fixtures.housingModel())
        let error = #expect(throws: EngineError.self) { try trainer.train(on: try Fixtures.linear()) }
        #expect(error?.message.contains("no input 'numeric'") == true)
    }

    @Test func outOfRangeCategoryIsAClearError() throws {
        let data = try TensorDataset(
            inputs: ["numeric": Tensor(shape: [1, 10]), "chas": Tensor(shape: [1, 1], scalars: [2]), "rad": Tensor(shape: [1, 1])],
            targets: Tensor(shape: [1, 1])
        )
        let trainer = try Trainer(model: try Fixtures.housingModel())
        let error = #expect(throws: EngineError.self) { try trainer.train(on: data) }
        #expect(error?.code == .invalidArgument)
        #expect(error?.message.contains("chasEmbedding") == true)
    }
}

/// Plain SGD steps the dense layers inside back-propagation (``CompiledModel/backward(batch:descentRate:)``);
/// a run must end where storing every gradient and stepping afterwards ends.
@Suite struct PlainSGDStepTests {
    /// A model with trained and frozen embeddings, a frozen dense layer, dense layers with and without bias.
    static func model(frozenEmbeddings: Bool) throws -> Model {
        try Model(
            name: "mixed",
            inputs: [InputSpec(name: "numeric", shape: [10]), InputSpec(name: "rad", shape: [1], categorical: true)],
            seed: 4
        ) {
            Embedding(vocabularySize: 9, embeddingSize: 5, name: "radEmbedding", inputs: ["rad"], frozen: frozenEmbeddings)
            Dense(units: 7, name: "frozenDense", inputs: ["numeric"], frozen: true)
            Concat(name: "features", inputs: ["frozenDense", "radEmbedding"])
            Dense(units: 19)
            ReLU()
            Dense(units: 9, useBias: false)
            Tanh()
            Dense(units: 1)
        }
    }

    @Test(arguments: [false, true])
    func matchesGradientsThenUpdate(frozenEmbeddings: Bool) throws {
        let model = try Self.model(frozenEmbeddings: frozenEmbeddings)
        let data = try Fixtures.housingData(count: 44)
        let batch = 8, rate: Float = 0.05
        let trainer = try Trainer(
            model: model,
            configuration: TrainingConfiguration(
                loss: .meanSquaredError, optimizer: .sgd(learningRate: Double(rate)), epochs: 2, batchSize: batch, shuffle: false
            ))
        let trained = try trainer.train(on: data).model.flatParameters()

        let plan = try CompiledModel(model: model, batchCapacity: batch, loss: .meanSquaredError)
        var weights = plan.flatParameters()
        for _ in 0..<2 {
            for start in stride(from: 0, to: data.count, by: batch) {
                let samples = Array(start..<min(start + batch, data.count))
                var inputs: [String: Tensor] = [:]
                for (i, spec) in data.inputSpecs.enumerated() {
                    var values = [Float](repeating: 0, count: samples.count * spec.elementCount)
                    values.withUnsafeMutableBufferPointer { buffer in
                        for (row, sample) in samples.enumerated() {
                            data.copyInput(
                                i, of: sample, into: UnsafeMutableBufferPointer(rebasing: buffer[(row * spec.elementCount)..<((row + 1) * spec.elementCount)]))
                        }
                    }
                    inputs[spec.name] = Tensor(shape: [samples.count] + spec.shape, scalars: values)
                }
                var targets = [Float](repeating: 0, count: samples.count)
                targets.withUnsafeMutableBufferPointer { buffer in
                    for (row, sample) in samples.enumerated() {
                        data.copyTarget(of: sample, into: UnsafeMutableBufferPointer(rebasing: buffer[row..<(row + 1)]))
                    }
                }
                try plan.setFlatParameters(weights)
                _ = try plan.computeGradients(inputs: inputs, targets: Tensor(shape: [samples.count, 1], scalars: targets))
                for (i, g) in plan.flatGradients().enumerated() { weights[i] -= rate * g }
            }
        }
        let worst = zip(trained, weights).map { abs($0 - $1) }.max() ?? 0
        #expect(worst < 1e-6)
        // The frozen layer did not move; the trained ones did.
        let offset = plan.parameterOffsets["frozenDense.weight"]!
        #expect(trained[offset] == model.flatParameters()[offset])
        #expect(trained != model.flatParameters())
    }
}
