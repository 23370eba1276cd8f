import OrchardSupport
import OrchardFormats
@testable import OrchardML
import Testing

/// ``TrainingConfiguration/batchShards``: a batch cut into parts run side by side trains the same model as the whole
/// batch, up to float rounding (the parts' products sum in another order).
@Suite struct BatchShardTests {
    /// Trains `model` on `data` with `shards` parts per batch; returns the flat parameters and the epoch losses.
    private func train(_ model: Model, on data: TensorDataset, loss: LossType, optimizer: OptimizerSpec, batch: Int, shards: Int) throws -> ([Float], [Double])
    {
        let trainer = try Trainer(
            model: model,
            configuration: TrainingConfiguration(
                loss: loss, optimizer: optimizer, epochs: 3, batchSize: batch, seed: 4, batchShards: shards
            ))
        guard case .completed(let report) = try trainer.train(on: data) else {
            Issue.record("training was interrupted")
            return ([], [])
        }
        return (report.model.flatParameters(), report.epochs.map(\.loss))
    }

    private func expectClose(_ a: ([Float], [Double]), _ b: ([Float], [Double]), tolerance: Float, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(a.0.count == b.0.count, sourceLocation: sourceLocation)
        let worst = zip(a.0, b.0).map { abs($0 - $1) / max(1, abs($1)) }.max() ?? 0
        #expect(worst <= tolerance, "largest relative difference \(worst)", sourceLocation: sourceLocation)
        for (x, y) in zip(a.1, b.1) { #expect(abs(x - y) <= Double(tolerance) * max(1, abs(y)), sourceLocation: sourceLocation) }
    }

    @Test(
        "cross-entropy with plain SGD (fused into back-propagation when whole) and with Adam",
        arguments: [
            OptimizerSpec.sgd(learningRate: 0.1), .adam(learningRate: 0.01),
        ])
    func crossEntropy(optimizer: OptimizerSpec) throws {
        let model = try Model(name: "mlp", inputShape: [6], seed: 3) {
            Dense(units: 16)
            ReLU()
            Dense(units: 3)
            Softmax()
        }
        var random = OrchardRandom(seed: 12)
        let count = 70  // batches of 16: the last one holds 6
        let xs = (0..<(count * 6)).map { _ in random.nextFloat(symmetric: 1) }
        let ys = (0..<count).map { _ in Float(random.nextInt(below: 3)) }
        let data = try TensorDataset(input: Tensor(shape: [count, 6], scalars: xs), targets: Tensor(shape: [count, 1], scalars: ys))
        let whole = try train(model, on: data, loss: .crossEntropy, optimizer: optimizer, batch: 16, shards: 1)
        for shards in [2, 3] {
            let parts = try train(model, on: data, loss: .crossEntropy, optimizer: optimizer, batch: 16, shards: shards)
            expectClose(parts, whole, tolerance: 1e-5)
        }
        // Training moved the weights: a step that did nothing would also "agree".
        #expect(zip(whole.0, model.flatParameters()).map { abs($0 - $1) }.max()! > 1e-2)
    }

    @Test("mean squared error with frozen embeddings and momentum")
    func meanSquaredErrorWithFrozenParameters() throws {
        let model = try Fixtures.housingModel(seed: 7)
        let data = try Fixtures.housingData()
        let whole = try train(model, on: data, loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.01, momentum: 0.9), batch: 20, shards: 1)
        let parts = try train(model, on: data, loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.01, momentum: 0.9), batch: 20, shards: 2)
        expectClose(parts, whole, tolerance: 1e-5)
        let trained = try Trainer(
            model: model, configuration: TrainingConfiguration(optimizer: .sgd(learningRate: 0.01), epochs: 1, batchSize: 20, batchShards: 2))
        let after = try trained.train(on: data).model
        #expect(after.parameter("chasEmbedding.weight") == model.parameter("chasEmbedding.weight"))
        #expect(after.parameter("dense1.weight") != model.parameter("dense1.weight"))
    }

    @Test("the summed gradient and the step are applied in slices that cover the trainable values once, in order")
    func slicesCoverTheRangesOnce() {
        let cases: [([Range<Int>], Int)] = [
            ([0..<199_210], 2), ([0..<10, 20..<23, 40..<41, 50..<90], 2), ([0..<10, 20..<23, 40..<41, 50..<90], 3),
            ([0..<5], 8), ([], 2), ([0..<7, 7..<9], 1), ([3..<4, 10..<10, 12..<30], 4),
        ]
        for (ranges, count) in cases {
            let slices = Trainer.slices(of: ranges, into: count)
            #expect(slices.count <= max(count, 1))
            let flat = slices.flatMap { $0 }.flatMap { Array($0) }
            #expect(flat == ranges.flatMap { Array($0) }, "\(ranges) into \(count)")
            let lengths = slices.map { $0.reduce(0) { $0 + $1.count } }
            let total = ranges.reduce(0) { $0 + $1.count }
            if count > 1 && total > 0 { #expect(lengths.allSatisfy { $0 <= (total + count - 1) / count }) }
        }
    }

    @Test("more parts than samples in a batch, and bad settings")
    func edges() throws {
        let model = try Model(name: "linear", inputShape: [3], seed: 2) { Dense(units: 1) }
        let data = try Fixtures.linear(count: 13)
        // Batches of 4 in 5 parts: at most 4 run (one sample each); the last batch (1 sample) runs whole.
        let whole = try train(model, on: data, loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.05), batch: 4, shards: 1)
        let parts = try train(model, on: data, loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.05), batch: 4, shards: 5)
        expectClose(parts, whole, tolerance: 1e-5)
        #expect { try Trainer(model: model, configuration: TrainingConfiguration(batchShards: 0)) } throws: {
            ($0 as? EngineError)?.code == .invalidArgument
        }
        let dropout = try Model(name: "dropout", inputShape: [3], seed: 2) {
            Dense(units: 4)
            Dropout(rate: 0.5)
            Dense(units: 1)
        }
        #expect { try Trainer(model: dropout, configuration: TrainingConfiguration(batchShards: 2)) } throws: { error in
            guard let error = error as? EngineError else { return false }
            return error.code == .invalidArgument && error.message.contains("dropout")
        }
        #expect(throws: Never.self) { try Trainer(model: dropout, configuration: TrainingConfiguration(batchShards: 1)) }
    }
}
