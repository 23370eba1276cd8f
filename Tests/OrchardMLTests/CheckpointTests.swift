import Foundation
import OrchardFormats
import OrchardML
import OrchardSupport
import Testing

@Suite struct CheckpointTests {
    static let configuration = TrainingConfiguration(
        loss: .meanSquaredError, optimizer: .adam(learningRate: 0.01), epochs: 3, batchSize: 10, seed: 77
    )

    /// Trains in a task that cancels itself after `stopAfter` updates; returns the outcome.
    static func trainCancelling(
        after stopAfter: Int, model: Model, resumingFrom state: TrainingState? = nil, configuration: TrainingConfiguration = configuration
    ) async throws -> TrainingOutcome {
        let data = try Fixtures.housingData()
        let task = Task { () throws -> TrainingOutcome in
            let trainer = try Trainer(model: model, configuration: configuration)
            return try trainer.train(on: data, resumingFrom: state) { progress in
                if progress.updates == stopAfter { withUnsafeCurrentTask { $0?.cancel() } }
            }
        }
        return try await task.value
    }

    @Test(arguments: [OptimizerSpec.adam(learningRate: 0.01), .sgd(learningRate: 0.01, momentum: 0.9, weightDecay: 0.001)])
    func interruptedAndResumedRunIsBitIdenticalToAnUninterruptedOne(optimizer: OptimizerSpec) async throws {
        var configuration = Self.configuration
        configuration.optimizer = optimizer
        let model = try Fixtures.housingModel(seed: 4)
        let data = try Fixtures.housingData()
        let straight = try Trainer(model: model, configuration: configuration).train(on: data)
        guard case .completed(let expected) = straight else { Issue.record("uninterrupted run stopped"); return }

        // Stop in the middle of the second epoch (10 batches per epoch), save, reload, resume in a new trainer.
        let first = try await Self.trainCancelling(after: 14, model: model, configuration: configuration)
        guard case .interrupted(let state) = first else { Issue.record("run was not interrupted"); return }
        #expect(state.position.epoch == 1 && state.position.batch == 4 && state.position.updates == 14)
        let restored = try TrainingState(checkpoint: state.checkpoint(), model: model)
        #expect(restored.position == state.position)
        #expect(restored.optimizer == state.optimizer)
        let resumed = try Trainer(model: restored.model, configuration: configuration).train(on: data, resumingFrom: restored)
        guard case .completed(let report) = resumed else { Issue.record("resumed run stopped"); return }
        #expect(report.updates == expected.updates)
        #expect(report.model.flatParameters().map(\.bitPattern) == expected.model.flatParameters().map(\.bitPattern))
        #expect(report.epochs == expected.epochs)
    }

    /// A stacked recurrent model (a CIFG LSTM, dropout, a GRU) stopped mid-epoch and resumed ends bit-identical to an
    /// uninterrupted run, as the other layers do.
    @Test func aRecurrentModelResumesMidEpochBitIdentically() async throws {
        var random = OrchardRandom(seed: 11)
        let count = 60
        let inputs = Tensor(shape: [count, 6, 2], scalars: (0..<(count * 12)).map { _ in random.nextFloat(symmetric: 1) })
        let targets = Tensor(shape: [count, 1], scalars: (0..<count).map { _ in random.nextFloat(symmetric: 1) })
        let data = try TensorDataset(input: inputs, targets: targets)
        let model = try Model(
            name: "recurrent", inputs: [InputSpec(name: "input", shape: [6, 2])],
            layers: [LSTM(units: 5, returnSequences: true, cifg: true), Dropout(rate: 0.25), GRU(units: 4), Dense(units: 1)], seed: 8)
        let configuration = TrainingConfiguration(loss: .meanSquaredError, optimizer: .adam(learningRate: 0.01), epochs: 3, batchSize: 10, seed: 5)
        guard case .completed(let expected) = try Trainer(model: model, configuration: configuration).train(on: data) else {
            Issue.record("uninterrupted run stopped")
            return
        }
        let task = Task { () throws -> TrainingOutcome in
            try Trainer(model: model, configuration: configuration).train(on: data) { progress in
                if progress.updates == 9 { withUnsafeCurrentTask { $0?.cancel() } }
            }
        }
        guard case .interrupted(let state) = try await task.value else {
            Issue.record("run was not interrupted")
            return
        }
        #expect(state.position.epoch == 1 && state.position.batch == 3)
        let restored = try TrainingState(checkpoint: state.checkpoint(), model: model)
        guard case .completed(let report) = try Trainer(model: restored.model, configuration: configuration).train(on: data, resumingFrom: restored)
        else {
            Issue.record("resumed run stopped")
            return
        }
        #expect(report.model.flatParameters().map(\.bitPattern) == expected.model.flatParameters().map(\.bitPattern))
        #expect(report.model.flatParameters() != model.flatParameters(), "training moved the parameters")
    }

    @Test func cancelledBeforeTheFirstBatchChangesNothing() async throws {
        let model = try Fixtures.housingModel()
        let data = try Fixtures.housingData()
        let task = Task { () throws -> TrainingOutcome in
            withUnsafeCurrentTask { $0?.cancel() }
            return try Trainer(model: model, configuration: Self.configuration).train(on: data)
        }
        guard case .interrupted(let state) = try await task.value else { Issue.record("not interrupted"); return }
        #expect(state.position == .start)
        #expect(state.model.flatParameters() == model.flatParameters())
    }

    @Test func weightsRoundTripThroughSafetensorsFiles() throws {
        let model = try Fixtures.housingModel(seed: 12)
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-weights-\(UUID().uuidString).safetensors")
        defer { try? FileManager.default.removeItem(at: url) }
        try model.writeWeights(to: url)
        var other = try Fixtures.housingModel(seed: 13)
        #expect(other.flatParameters() != model.flatParameters())
        try other.readWeights(from: url)
        #expect(other.flatParameters() == model.flatParameters())
    }

    @Test func loadingRejectsWrongNamesShapesAndDTypes() throws {
        var model = try Fixtures.housingModel()
        var records = model.weightRecords
        records[0] = TensorRecord(name: records[0].name, shape: [4], values: records[0].values)
        var error = #expect(throws: EngineError.self) { try model.loadWeights(safetensors: Safetensors.encode(records)) }
        #expect(error?.code == .incompatibleCheckpoint)
        #expect(error?.message.contains("chasEmbedding.weight") == true && error?.message.contains("shape") == true)

        records = model.weightRecords.filter { $0.name != "dense3.bias" }
        error = #expect(throws: EngineError.self) { try model.loadWeights(safetensors: Safetensors.encode(records)) }
        #expect(error?.message.contains("dense3.bias") == true)

        records = model.weightRecords + [TensorRecord(name: "extra.weight", shape: [1], values: [0])]
        error = #expect(throws: EngineError.self) { try model.loadWeights(safetensors: Safetensors.encode(records)) }
        #expect(error?.message.contains("extra.weight") == true)

        // An F64 tensor: header says F64, 8 bytes of data.
        let header = #"{"dense3.bias":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#
        var bytes = withUnsafeBytes(of: UInt64(header.utf8.count).littleEndian, Array.init)
        bytes += Array(header.utf8) + [UInt8](repeating: 0, count: 8)
        error = #expect(throws: EngineError.self) { try model.loadWeights(safetensors: bytes) }
        #expect(error?.code == .incompatibleCheckpoint)
        #expect(error?.message.contains("F64") == true, "\(error?.message ?? "")")
    }

    /// A state whose position is not one (a file edited or damaged in a way its structure survives) is refused before
    /// training, instead of trapping where the epoch's order is derived (epoch −1) or indexed (batch −1).
    @Test func aStateWithANegativePositionIsRefused() async throws {
        let model = try Fixtures.housingModel(seed: 4)
        let outcome = try await Self.trainCancelling(after: 3, model: model)
        for edit: (inout TrainingPosition) -> Void in [
            { $0.epoch = -1 }, { $0.batch = -1 }, { $0.updates = -5 }, { $0.epochSamples = -1 }, { $0.epochUpdates = -1 },
        ] {
            var state = outcome.state
            edit(&state.position)
            // Through the file format too: the position survives the round trip, and restoring refuses it.
            let reread = try TrainingState(checkpoint: state.checkpoint(), model: model)
            let error = #expect(throws: EngineError.self) {
                try Trainer(model: model, configuration: Self.configuration).train(on: try Fixtures.housingData(), resumingFrom: reread)
            }
            #expect(error?.code == .incompatibleCheckpoint && error?.message.contains("position") == true)
        }
        // A NaN loss sum is a diverged run's, resumed as it was: not refused.
        var diverged = outcome.state
        diverged.position.epochLossSum = .nan
        _ = try Trainer(model: model, configuration: Self.configuration).train(
            on: try Fixtures.housingData(), resumingFrom: try TrainingState(checkpoint: diverged.checkpoint(), model: model))
    }

    @Test func trainingStateRejectsAnotherModel() async throws {
        let outcome = try await Self.trainCancelling(after: 3, model: try Fixtures.housingModel())
        let bytes = outcome.state.checkpoint()
        let other = try Model(name: "x", inputShape: [3]) { Dense(units: 1) }
        let error = #expect(throws: EngineError.self) { try TrainingState(checkpoint: bytes, model: other) }
        #expect(error?.code == .incompatibleCheckpoint)
        let weightsOnly = try Fixtures.housingModel().weightsSafetensors()
        #expect(throws: EngineError.self) { try TrainingState(checkpoint: weightsOnly, model: try Fixtures.housingModel()) }
    }
}
