import OrchardFormats
@testable import OrchardML
import OrchardSupport
import Testing

/// FedProx (Li et al. 2020): the local objective gains μ/2·‖w − w₀‖², w₀ the model the trainer was created with.
@Suite struct FedProxTests {
    static func model() throws -> Model {
        try Model(name: "prox", inputs: [InputSpec(name: "input", shape: [3])], layers: [Dense(units: 4), Tanh(), Dense(units: 1)], seed: 5)
    }

    /// `count` random samples of three inputs and one target, each in [-1, 1], from `seed`.
    static func samples(_ count: Int, seed: UInt64) throws -> (xs: Tensor, ys: Tensor, data: TensorDataset) {
        var generator = OrchardRandom(seed: seed)
        let xs = Tensor(shape: [count, 3], scalars: (0..<(3 * count)).map { _ in generator.nextFloat(symmetric: 1) })
        let ys = Tensor(shape: [count, 1], scalars: (0..<count).map { _ in generator.nextFloat(symmetric: 1) })
        return (xs, ys, try TensorDataset(input: xs, targets: ys))
    }

    /// One full-batch SGD step from weights w₁ ≠ w₀ moves them by −lr·(∇L(w₁) + μ·(w₁ − w₀)), with ∇L taken by finite
    /// differences of the batch-mean loss: the proximal term's gradient, checked through the trainer itself.
    @Test func oneStepFollowsTheProximalObjectivesGradient() throws {
        let anchorModel = try Self.model()
        let (xs, ys, data) = try Self.samples(16, seed: 4)
        let (lr, mu) = (0.05, 0.8)
        let trainer = try Trainer(
            model: anchorModel,
            configuration: TrainingConfiguration(optimizer: .sgd(learningRate: lr), epochs: 1, batchSize: 16, shuffle: false, proximalMu: mu))
        let w0 = anchorModel.flatParameters()
        var random = OrchardRandom(seed: 9)
        let w1 = w0.map { $0 + random.nextFloat(symmetric: 0.3) }
        try trainer.plan.setFlatParameters(w1)
        _ = try trainer.train(on: data)
        let w2 = trainer.model.flatParameters()

        // ∇L(w₁) by central differences on a separate plan over the same batch.
        let plan = try CompiledModel(model: anchorModel, batchCapacity: 16, loss: .meanSquaredError)
        func loss(_ w: [Float]) throws -> Double {
            try plan.setFlatParameters(w)
            return Double(try plan.computeGradients(inputs: ["input": xs], targets: ys))
        }
        var checked = 0
        for i in w1.indices {
            let h: Float = 1e-3
            var plus = w1, minus = w1
            plus[i] += h
            minus[i] -= h
            let gradient = (try loss(plus) - loss(minus)) / Double(2 * h)
            let expected = Double(w1[i]) - lr * (gradient + mu * Double(w1[i] - w0[i]))
            #expect(abs(Double(w2[i]) - expected) <= 2e-4 + 1e-3 * abs(expected), "w[\(i)]: \(w2[i]) against \(expected)")
            checked += 1
        }
        #expect(checked == w1.count)
    }

    /// A frozen layer's parameters get no proximal term either: from weights w₁ ≠ w₀ a step leaves them at w₁.
    @Test func frozenParametersGetNoProximalTerm() throws {
        var anchorModel = try Model(
            name: "prox", inputs: [InputSpec(name: "input", shape: [3])], layers: [Dense(units: 4, name: "hidden"), Tanh(), Dense(units: 1, name: "head")],
            seed: 5)
        try anchorModel.setFrozen(true, layer: "hidden")
        let data = try Fixtures.linear(count: 16, seed: 8)
        let trainer = try Trainer(
            model: anchorModel,
            configuration: TrainingConfiguration(optimizer: .sgd(learningRate: 0.1), epochs: 1, batchSize: 16, shuffle: false, proximalMu: 5))
        var random = OrchardRandom(seed: 2)
        let w1 = anchorModel.flatParameters().map { $0 + random.nextFloat(symmetric: 0.5) }
        try trainer.plan.setFlatParameters(w1)
        _ = try trainer.train(on: data)
        let w2 = trainer.model.flatParameters()
        let frozen = trainer.plan.parameterOffsets.filter { $0.key.hasPrefix("hidden.") }
        #expect(!frozen.isEmpty)
        for (name, offset) in frozen {
            let count = anchorModel.parameterShapes[name]!.reduce(1, *)
            #expect(Array(w2[offset..<(offset + count)]) == Array(w1[offset..<(offset + count)]), "\(name) moved")
        }
        let moved = trainer.plan.parameterOffsets.filter { $0.key.hasPrefix("head.") }.contains { name, offset in
            w2[offset] != w1[offset]
        }
        #expect(moved, "the trainable head took its step")
    }

    /// A larger μ keeps the trained model nearer the one received; μ = 0 trains exactly as without FedProx.
    @Test func muPullsTheLocalModelTowardTheReceivedOne() throws {
        let data = try Fixtures.linear(count: 64, seed: 2)
        func distance(mu: Double) throws -> (distance: Float, weights: [Float]) {
            let model = try Self.model()
            let trainer = try Trainer(
                model: model,
                configuration: TrainingConfiguration(optimizer: .sgd(learningRate: 0.05), epochs: 20, batchSize: 8, seed: 3, proximalMu: mu))
            _ = try trainer.train(on: data)
            let w = trainer.model.flatParameters(), w0 = model.flatParameters()
            return (zip(w, w0).reduce(0) { $0 + ($1.0 - $1.1) * ($1.0 - $1.1) }.squareRoot(), w)
        }
        let plain = try Trainer(
            model: try Self.model(), configuration: TrainingConfiguration(optimizer: .sgd(learningRate: 0.05), epochs: 20, batchSize: 8, seed: 3))
        _ = try plain.train(on: data)
        let (free, freeWeights) = try distance(mu: 0)
        let (held, _) = try distance(mu: 1)
        let (tight, _) = try distance(mu: 10)
        #expect(freeWeights == plain.model.flatParameters(), "μ = 0 is plain training")
        #expect(held < free && tight < held, "‖w − w₀‖: μ=0 \(free), μ=1 \(held), μ=10 \(tight)")
    }

    /// With batch shards the proximal term is added once to the summed gradient: the same step as one part.
    @Test func batchShardsTakeTheSameProximalStep() throws {
        let data = try Fixtures.linear(count: 32, seed: 6)
        func trained(shards: Int) throws -> [Float] {
            let trainer = try Trainer(
                model: try Self.model(),
                configuration: TrainingConfiguration(
                    optimizer: .sgd(learningRate: 0.05), epochs: 3, batchSize: 8, seed: 1, batchShards: shards, proximalMu: 2))
            _ = try trainer.train(on: data)
            return trainer.model.flatParameters()
        }
        let one = try trained(shards: 1), two = try trained(shards: 2)
        #expect(zip(one, two).allSatisfy { abs($0 - $1) <= 1e-4 })
    }

    @Test(arguments: [-0.1, Double.nan, Double.infinity])
    func anUnusableMuIsRefused(_ mu: Double) throws {
        let error = #expect(throws: EngineError.self) { try Trainer(model: try Self.model(), configuration: TrainingConfiguration(proximalMu: mu)) }
        #expect(error?.code == .invalidArgument && error?.message.contains("proximalMu") == true)
    }

    /// A regressor's loss sums are the same taken in parts of the dataset (as a wide output is, to bound memory) or in
    /// one pass.
    @Test func regressionMetricsAreTheSameWhateverTheBatch() throws {
        let model = try Self.model()
        let (_, ys, data) = try Self.samples(23, seed: 11)
        let whole = try model.evaluationMetrics(on: data, loss: .meanSquaredError)
        #expect(whole.samples == 23 && whole.values["mae"] != nil)
        // Parts of 5 samples (an output budget of 5 values): the same sums as one pass with the same batch size.
        let targets = ys.scalars
        let onePass = try model.lossSums(on: data, targets: targets, loss: .meanSquaredError, batchSize: 5)
        let inParts = try model.lossSums(on: data, targets: targets, loss: .meanSquaredError, batchSize: 5, outputBudget: 5)
        #expect(inParts == onePass)
        // Equal to rounding across batch sizes: a smaller batch may take another matrix kernel.
        let single = try model.evaluationMetrics(on: data, loss: .meanSquaredError, batchSize: 1)
        #expect(abs(single.loss - whole.loss) <= 1e-6 * max(whole.loss, 1e-6))
    }
}
