import OrchardClient
import OrchardFormats
import OrchardML
import OrchardProtocol
import Testing

@Suite("training settings: built-in defaults < architecture < process client config")
struct TrainingSettingsTests {
    static let bare = ModelSpec(
        name: "m", inputs: [InputSpec(name: "x", shape: [2])],
        layers: [
            LayerSpec(name: "d", type: .dense, inputs: ["x"], units: 1, inputSize: 2)
        ])

    static var withTraining: ModelSpec {
        var spec = bare
        spec.training = TrainingSpec(loss: .crossEntropy, optimizer: .adam(learningRate: 0.002, beta1: 0.8), epochs: 4, batchSize: 16, maxUpdates: 30)
        return spec
    }

    @Test func anEmptyClientConfigOnABareArchitectureGetsTheBuiltInDefaults() throws {
        let resolved = try TrainingConfiguration.resolved(architecture: Self.bare, clientConfig: ClientConfig(), seed: 9)
        #expect(resolved == TrainingConfiguration(seed: 9))
    }

    @Test func theArchitectureReplacesEveryDefault() throws {
        let resolved = try TrainingConfiguration.resolved(architecture: Self.withTraining, clientConfig: ClientConfig(), seed: 1)
        #expect(resolved == TrainingConfiguration(Self.withTraining.training!, seed: 1))
    }

    @Test func eachKeyTheProcessSetsWinsAndTheRestStays() throws {
        let resolved = try TrainingConfiguration.resolved(
            architecture: Self.withTraining, clientConfig: ClientConfig(batchSize: 5, learningRate: 0.3), seed: 2
        )
        #expect(resolved.batchSize == 5)
        #expect(resolved.optimizer.learningRate == 0.3)
        // The architecture's optimizer keeps its type and other hyper-parameters; unset keys keep its values.
        #expect(resolved.optimizer.type == "adam" && resolved.optimizer.beta1 == 0.8)
        #expect(resolved.epochs == 4 && resolved.maxUpdates == 30 && resolved.loss == .crossEntropy)
        let all = try TrainingConfiguration.resolved(
            architecture: Self.withTraining, clientConfig: ClientConfig(batchSize: 1, learningRate: 1, localEpochs: 2, maxUpdates: 3), seed: 2
        )
        #expect(all.batchSize == 1 && all.optimizer.learningRate == 1 && all.epochs == 2 && all.maxUpdates == 3)
    }

    @Test(arguments: [
        ClientConfig(batchSize: 0), ClientConfig(learningRate: -1), ClientConfig(learningRate: .infinity), ClientConfig(localEpochs: 0),
        ClientConfig(maxUpdates: 0),
    ])
    func anUnusableClientConfigIsAnIncompatibleModel(config: ClientConfig) {
        let error = #expect(throws: OrchardClientError.self) {
            try TrainingConfiguration.resolved(architecture: Self.bare, clientConfig: config, seed: 0)
        }
        #expect(error?.code == .incompatibleModel)
    }

    @Test func plannedUpdatesAreEpochsTimesBatchesCappedByMaxUpdates() {
        #expect(TrainingConfiguration(epochs: 2, batchSize: 10).plannedUpdates(samples: 25) == 6)
        #expect(TrainingConfiguration(epochs: 2, batchSize: 10, maxUpdates: 4).plannedUpdates(samples: 25) == 4)
        #expect(TrainingConfiguration(epochs: 3, batchSize: 8).plannedUpdates(samples: 0) == 0)
        // A huge epoch count from a client config saturates instead of trapping the device.
        #expect(TrainingConfiguration(epochs: Int.max, batchSize: 1).plannedUpdates(samples: 3) == Int.max)
        #expect(TrainingConfiguration(epochs: Int.max, batchSize: 1, maxUpdates: 9).plannedUpdates(samples: 3) == 9)
        #expect(TrainingConfiguration(epochs: 1, batchSize: Int.max).plannedUpdates(samples: Int.max) == 1)
    }

    @Test("a paused run resumes to the same diff as an uninterrupted one, and its checkpoint says how far it got")
    func pausedRunResumesExactly() throws {
        let weights = try Safetensors.decode(Fixture.initialWeights()).tensors
        let training = try TrainingConfiguration.resolved(
            architecture: Fixture.spec, clientConfig: ClientConfig(batchSize: 4, learningRate: 0.05, localEpochs: 3), seed: 7)
        let trainer = EngineLocalTrainer()
        let whole = LocalTrainingTask(model: CycleModel(spec: Fixture.spec, weights: weights), training: training)
        guard case .completed(let reference) = try trainer.train(whole, on: Fixture.dataset(), resumingFrom: nil, progress: { _ in }) else {
            Issue.record("an unpaused run must complete")
            return
        }
        var paused = whole
        paused.pauseAfterUpdates = 5
        guard case .interrupted(let checkpoint) = try trainer.train(paused, on: Fixture.dataset(), resumingFrom: nil, progress: { _ in }) else {
            Issue.record("a run paused short of its end must return its state")
            return
        }
        #expect(try trainer.completedUpdates(in: checkpoint, of: whole) == 5)
        guard case .completed(let resumed) = try trainer.train(whole, on: Fixture.dataset(), resumingFrom: checkpoint, progress: { _ in }) else {
            Issue.record("the resumed run must complete")
            return
        }
        #expect(resumed.diff == reference.diff)
        #expect(resumed.sampleCount == reference.sampleCount)
    }
}
