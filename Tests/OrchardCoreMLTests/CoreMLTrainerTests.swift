#if os(Linux)
import AppleShimTesting
import CoreML
import Foundation
import OrchardClient
import OrchardCoreML
import OrchardCoreMLTrainer
import OrchardFormats
import OrchardML
import OrchardSupport
import Testing

/// The Core ML trainer against the Core ML shim: the shim's "on-device training" imports the model Core ML was
/// given, rebuilds the samples from the Core ML features and trains with Orchard's engine using the update
/// parameters it was handed — so the diff the trainer reads back must equal the engine trainer's on the same data.
@Suite(.serialized, .timeLimit(.minutes(1))) struct CoreMLTrainerTests {
    static let spec = ModelSpec(
        name: "small", inputs: [InputSpec(name: "x", shape: [2])],
        layers: [
            LayerSpec(name: "hidden", type: .dense, inputs: ["x"], frozen: true, units: 3, inputSize: 2),
            LayerSpec(name: "act", type: .relu, inputs: ["hidden"]),
            LayerSpec(name: "out", type: .dense, inputs: ["act"], units: 1, inputSize: 3),
        ])

    static let weights = [
        TensorRecord(name: "hidden.weight", shape: [3, 2], values: [0.5, -0.2, 0.1, 0.4, -0.3, 0.8]),
        TensorRecord(name: "hidden.bias", shape: [3], values: [0.1, 0, -0.1]),
        TensorRecord(name: "out.weight", shape: [1, 3], values: [0.3, -0.6, 0.2]),
        TensorRecord(name: "out.bias", shape: [1], values: [0.05]),
    ]

    static func dataset() throws -> TensorDataset {
        let x: [Float] = [1, 2, -1, 0.5, 0.3, -0.7, 2, 1, -1.5, -0.5, 0.2, 0.9, 1.1, -0.4, 0.6, 0.6]
        let y: [Float] = [0.4, -0.2, 0.1, 0.9, -0.5, 0.3, 0.2, 0.7]
        return try TensorDataset(inputs: ["x": Tensor(shape: [8, 2], scalars: x)], targets: Tensor(shape: [8, 1], scalars: y))
    }

    static let training = TrainingConfiguration(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.1), epochs: 2, batchSize: 4, seed: 11, shuffle: false)

    /// What the shim's training saw.
    final class Seen: @unchecked Sendable {
        var parameters: [String: String] = [:]
        var samples = 0
    }

    /// The shim trains with Orchard's engine, on the samples rebuilt from the Core ML features.
    static func engineTraining(seed: UInt64, seen: Seen) -> @Sendable (SimulatedCoreMLTraining.Run) throws -> [MLParameterKey: MLMultiArray] {
        { run in
            let imported = try CoreMLImporter().importModel(from: [UInt8](Data(contentsOf: run.modelURL)))
            var x: [Float] = [], y: [Float] = []
            for index in 0..<run.trainingData.count {
                let features = run.trainingData.features(at: index)
                let input = try #require(features.featureValue(for: "x")?.multiArrayValue)
                let target = try #require(features.featureValue(for: "out_true")?.multiArrayValue)
                x += (0..<input.count).map { Float(truncating: input[$0]) }
                y += (0..<target.count).map { Float(truncating: target[$0]) }
            }
            seen.samples = run.trainingData.count
            seen.parameters = Dictionary(uniqueKeysWithValues: run.parameters.map { ("\($0.key)", "\($0.value)") })
            let data = try TensorDataset(
                inputs: ["x": Tensor(shape: [run.trainingData.count, 2], scalars: x)], targets: Tensor(shape: [run.trainingData.count, 1], scalars: y))
            let configuration = TrainingConfiguration(
                loss: imported.spec.training!.loss, optimizer: .sgd(learningRate: run.parameters[.learningRate] as! Double),
                epochs: run.parameters[.epochs] as! Int, batchSize: run.parameters[.miniBatchSize] as! Int, seed: seed,
                shuffle: run.parameters[.shuffle] as! Bool
            )
            let task = LocalTrainingTask(model: CycleModel(spec: imported.spec, weights: imported.weights), training: configuration)
            guard case .completed(let update) = try EngineLocalTrainer().train(task, on: data, resumingFrom: nil, progress: { _ in }) else {
                throw CoreMLTrainerTestError()
            }
            var updated: [MLParameterKey: MLMultiArray] = [:]
            for diff in update.diff where diff.name.hasPrefix("out.") {
                let original = imported.weights.first { $0.name == diff.name }!
                let array = try MLMultiArray(shape: [NSNumber(value: diff.values.count)], dataType: .double)
                for i in diff.values.indices { array[i] = NSNumber(value: Double(original.values[i] + diff.values[i])) }
                updated[diff.name.hasSuffix(".bias") ? MLParameterKey.biases.scoped(to: "out") : MLParameterKey.weights.scoped(to: "out")] = array
            }
            return updated
        }
    }

    struct CoreMLTrainerTestError: Error {}

    @Test func coreMLTrainingReportsTheDiffTheEngineComputesOnTheSameSamples() async throws {
        let seen = Seen()
        SimulatedCoreMLTraining.training = Self.engineTraining(seed: Self.training.seed, seen: seen)
        defer { SimulatedCoreMLTraining.training = nil }
        let task = LocalTrainingTask(model: CycleModel(spec: Self.spec, weights: Self.weights), training: Self.training)
        let data = try Self.dataset()
        guard case .completed(let coreML) = try await CoreMLLocalTrainer().train(task, on: data, resumingFrom: nil, progress: { _ in }),
            case .completed(let engine) = try EngineLocalTrainer().train(task, on: data, resumingFrom: nil, progress: { _ in })
        else {
            Issue.record("a run did not complete")
            return
        }
        #expect(coreML.sampleCount == 8 && seen.samples == 8)
        #expect(seen.parameters["learningRate"] == "0.1" && seen.parameters["epochs"] == "2" && seen.parameters["miniBatchSize"] == "4")
        #expect(coreML.diff.map(\.name) == Self.weights.map(\.name))
        let engineByName = Dictionary(uniqueKeysWithValues: engine.diff.map { ($0.name, $0) })
        #expect(engineByName.count == coreML.diff.count)
        for a in coreML.diff {
            let b = try #require(engineByName[a.name])
            #expect(a.shape == b.shape)
            #expect(zip(a.values, b.values).allSatisfy { abs($0 - $1) < 1e-6 }, "\(a.name): \(a.values) vs \(b.values)")
        }
        #expect(coreML.diff.filter { $0.name.hasPrefix("hidden.") }.allSatisfy { $0.values.allSatisfy { $0 == 0 } }, "the frozen layer is not trained")
        #expect(coreML.diff.first { $0.name == "out.weight" }?.values.contains { $0 != 0 } == true)
    }

    @Test func whatCoreMLCannotDoIsRefusedWithTheReason() async throws {
        let data = try Self.dataset()
        var capped = Self.training
        capped.maxUpdates = 2
        let trainer = CoreMLLocalTrainer()
        await #expect {
            try await trainer.train(
                LocalTrainingTask(model: CycleModel(spec: Self.spec, weights: Self.weights), training: capped), on: data, resumingFrom: nil, progress: { _ in })
        } throws: { ($0 as? OrchardClientError)?.code == .incompatibleModel && "\($0)".contains("no update cap") }
        let paused = LocalTrainingTask(model: CycleModel(spec: Self.spec, weights: Self.weights), training: Self.training, pauseAfterUpdates: 1)
        await #expect { try await trainer.train(paused, on: data, resumingFrom: nil, progress: { _ in }) } throws: { "\($0)".contains("cannot pause") }
        let task = LocalTrainingTask(model: CycleModel(spec: Self.spec, weights: Self.weights), training: Self.training)
        await #expect { try await trainer.train(task, on: data, resumingFrom: [1, 2], progress: { _ in }) } throws: { "\($0)".contains("cannot resume") }
        // Core ML failing the update is a training error with its reason.
        SimulatedCoreMLTraining.training = { _ in throw CoreMLTrainerTestError() }
        defer { SimulatedCoreMLTraining.training = nil }
        await #expect { try await trainer.train(task, on: data, resumingFrom: nil, progress: { _ in }) } throws: {
            ($0 as? OrchardClientError)?.code == .training && "\($0)".contains("update task failed")
        }
    }

    /// A clock that says when a sleep starts (the run's bound), on a manual clock.
    final class ObservedClock: WallClock {
        let base = ManualClock()
        let sleeps: AsyncStream<Void>
        private let started: AsyncStream<Void>.Continuation
        init() { (sleeps, started) = AsyncStream<Void>.makeStream() }
        var now: WallInstant { base.now }
        var minimumResolution: Duration { .zero }
        func sleep(until deadline: WallInstant, tolerance: Duration? = nil) async throws {
            started.yield()
            try await base.sleep(until: deadline, tolerance: tolerance)
        }
    }

    /// Starts a Core ML run, waits until the simulated Core ML has begun training (`began`), and cancels it.
    static func startThenCancel(grace: Duration, clock: ObservedClock, began: AsyncStream<Void>) async throws -> Task<LocalTrainingOutcome, any Error> {
        let trainer = CoreMLLocalTrainer(cancellationGrace: grace, clock: clock)
        let task = LocalTrainingTask(model: CycleModel(spec: spec, weights: weights), training: training)
        let data = try dataset()
        let run = Task { try await trainer.train(task, on: data, resumingFrom: nil, progress: { _ in }) }
        var started = began.makeAsyncIterator()
        _ = await started.next()
        run.cancel()
        return run
    }

    @Test func aCancelledRunEndsWithinTheGraceEvenIfCoreMLNeverCallsBack() async throws {
        // Core ML's documentation does not promise a completion call after cancel(): this one never calls back.
        let (began, training) = AsyncStream<Void>.makeStream()
        let (sawCancellation, saw) = AsyncStream<Bool>.makeStream()
        let release = DispatchSemaphore(value: 0)
        SimulatedCoreMLTraining.cancellation = .neverCallsBack
        SimulatedCoreMLTraining.training = { run in
            training.yield()
            release.wait()  // Core ML keeps its own thread busy until the test lets it go
            saw.yield(run.isCancelled())
            return [:]
        }
        defer {
            SimulatedCoreMLTraining.training = nil
            SimulatedCoreMLTraining.cancellation = .completesCancelled
        }
        let clock = ObservedClock()
        let run = try await Self.startThenCancel(grace: .seconds(2), clock: clock, began: began)
        var sleeping = clock.sleeps.makeAsyncIterator()
        _ = await sleeping.next()
        clock.base.advance(by: .seconds(2))
        do {
            _ = try await run.value
            Issue.record("a cancelled run completed")
        } catch let error as OrchardClientError {
            #expect(error.code == .cancelled)
            #expect(error.message.contains("did not confirm"))
        }
        release.signal()
        var seen = sawCancellation.makeAsyncIterator()
        #expect(await seen.next() == true, "Core ML was told to cancel")
    }

    @Test func aRunCancelledBeforeCoreMLStartsIsNeverStarted() async throws {
        let (began, training) = AsyncStream<Void>.makeStream()
        SimulatedCoreMLTraining.training = { _ in
            training.yield()
            return [:]
        }
        defer { SimulatedCoreMLTraining.training = nil }
        let trainer = CoreMLLocalTrainer(cancellationGrace: .seconds(3600), clock: ObservedClock())
        let task = LocalTrainingTask(model: CycleModel(spec: Self.spec, weights: Self.weights), training: Self.training)
        let data = try Self.dataset()
        let run = Task {
            withUnsafeCurrentTask { $0?.cancel() }  // the window expired while the model was being prepared
            return try await trainer.train(task, on: data, resumingFrom: nil, progress: { _ in })
        }
        do {
            _ = try await run.value
            Issue.record("a cancelled run completed")
        } catch let error as OrchardClientError {
            #expect(error.code == .cancelled)
        }
        // Core ML was never asked to train (the training would have been announced before the run could end).
        training.finish()
        var announced = began.makeAsyncIterator()
        #expect(await announced.next() == nil)
    }

    @Test func aCancelledRunThatCoreMLConfirmsEndsCancelledAtOnce() async throws {
        let (began, training) = AsyncStream<Void>.makeStream()
        let release = DispatchSemaphore(value: 0)
        SimulatedCoreMLTraining.training = { _ in
            training.yield()
            release.wait()
            return [:]
        }
        defer { SimulatedCoreMLTraining.training = nil }
        let run = try await Self.startThenCancel(grace: .seconds(3600), clock: ObservedClock(), began: began)
        release.signal()  // Core ML notices the cancellation and calls back: no need to wait for the grace
        do {
            _ = try await run.value
            Issue.record("a cancelled run completed")
        } catch let error as OrchardClientError {
            #expect(error.code == .cancelled)
            #expect(!error.message.contains("did not confirm"))
        }
    }
}
#endif
