import Foundation
import OrchardSupport
import Logging
import OrchardClient
import OrchardCoordinator
import OrchardFormats
import OrchardInProcess
import OrchardProtocol
import OrchardML
import Synchronization
@testable import OrchardSimulation

/// A workload whose "training" pulls a three-number weight toward the device's own optimum by the learning rate
/// per update, for as many updates as the settings the coordinator sent plan (resolved by the SDK, as a device
/// does); its checkpoint is the weight reached and the updates done. Every setting a device trained with is recorded.
struct FakeWorkload: FleetWorkload {
    let optima: [[Float]]
    let samples: [Int]
    /// The updates a round takes under the fake process's default client config (``FakeModel/clientConfig(updates:step:)``).
    let updates: Int
    /// The learning rate of that client config.
    let step: Float
    let seen = SeenSettings()

    func sampleCount(device: Int) -> Int { samples[device] }

    func train(device: Int, _ task: LocalTrainingTask, on indices: [Int]?, resumingFrom checkpoint: [UInt8]?) throws(OrchardClientError)
        -> LocalTrainingOutcome
    {
        seen.record(task.training)
        let total = task.training.plannedUpdates(samples: samples[device])
        let target = min(task.pauseAfterUpdates ?? total, total)
        let rate = Float(task.training.optimizer.learningRate)
        let start = try FakeModel.values(task.model.weights)
        var w = start
        var done = 0
        if let checkpoint {
            let archive = try FakeModel.archive(checkpoint)
            w = try FakeModel.values(archive.tensors)
            done = Int(archive.metadata["updates"] ?? "") ?? -1
        }
        while done < target {
            for i in w.indices { w[i] += rate * (optima[device][i] - w[i]) }
            done += 1
        }
        if done < total {
            return .interrupted(checkpoint: Safetensors.encode(FakeModel.records(w), metadata: ["updates": String(done)]))
        }
        return .completed(LocalUpdate(diff: FakeModel.records(zip(w, start).map { $0 - $1 }), sampleCount: samples[device], metrics: ["loss": 0]))
    }

    /// The squared distance of the model's weight from the device's optimum, over `indices.count` samples.
    func evaluate(device: Int, model: CycleModel, on indices: [Int]) throws(OrchardClientError) -> EvaluationMetrics {
        let w = try FakeModel.values(model.weights)
        let distance = zip(w, optima[device]).reduce(0.0) { $0 + Double(($1.0 - $1.1) * ($1.0 - $1.1)) }
        return EvaluationMetrics(samples: indices.count, loss: distance)
    }

    func completedUpdates(device: Int, in checkpoint: [UInt8], of task: LocalTrainingTask) throws(OrchardClientError) -> Int {
        guard let done = Int(try FakeModel.archive(checkpoint).metadata["updates"] ?? "") else {
            throw OrchardClientError(.training, "the fake checkpoint has no update count")
        }
        return done
    }

    func evaluate(model: [UInt8]) async throws(SimulationError) -> Evaluation {
        let w: [Float]
        do { w = try FakeModel.values(FakeModel.archive(model).tensors) } catch { throw SimulationError(.training, error.message) }
        let total = Float(samples.reduce(0, +))
        var loss = 0.0
        for i in w.indices {
            let target = zip(optima, samples).reduce(Float(0)) { $0 + $1.0[i] * Float($1.1) } / total
            loss += Double((w[i] - target) * (w[i] - target))
        }
        return Evaluation(loss: loss, accuracy: 1 / (1 + loss))
    }
}

/// The fake workload's model: one bias-free dense layer from one input to three outputs, i.e. one weight
/// tensor of three numbers, hosted on a real coordinator.
enum FakeModel {
    static let spec = ModelSpec(
        name: "fake", inputs: [InputSpec(name: "x", shape: [1])],
        layers: [
            LayerSpec(name: "w", type: .dense, inputs: ["x"], units: 3, inputSize: 1, useBias: false)
        ])

    static func records(_ values: [Float]) -> [TensorRecord] { [TensorRecord(name: "w.weight", shape: [3, 1], values: values)] }

    static func archive(_ bytes: [UInt8]) throws(OrchardClientError) -> SafetensorsArchive {
        do { return try Safetensors.decode(bytes) } catch { throw OrchardClientError(.training, "bad fake model: \(error)") }
    }

    static func values(_ tensors: [TensorRecord]) throws(OrchardClientError) -> [Float] {
        guard let w = tensors.first(where: { $0.name == "w.weight" }) else { throw OrchardClientError(.training, "no w.weight") }
        return w.values
    }

    /// The fake process's client config: `updates` single-sample updates at learning rate `step`.
    static func clientConfig(updates: Int, step: Float) -> ClientConfig {
        ClientConfig(batchSize: 1, learningRate: Double(step), localEpochs: updates, maxUpdates: updates)
    }

    static func process(goal: Int, overSelection: Double, cycleSeconds: Double, minimumReports: Int, clientConfig: ClientConfig, training: TrainingSpec? = nil)
        -> HostProcessRequest
    {
        var model = spec
        model.training = training
        return HostProcessRequest(
            name: "fake", version: SemanticVersion(1, 0), model: model, initialWeights: Safetensors.encode(records([0, 0, 0])),
            clientConfig: clientConfig,
            serverConfig: ServerConfig(
                cycleLength: cycleSeconds, cycles: 0, goalCount: goal, overSelection: overSelection, minimumReports: minimumReports,
                paceSteeringWindow: 20, checkpointRetention: 2
            )
        )
    }
}

/// A real coordinator (SQLite in a temporary directory, manual clock) with the fake process hosted, and a
/// fleet run against it through in-process calls or loopback HTTP.
enum FleetHarness {
    static func run(
        _ fleet: FleetSimulation, workload: FakeWorkload, goal: Int, overSelection: Double = 1, cycleSeconds: Double = 300,
        minimumReports: Int = 1, http: Bool = false, clientConfig: ClientConfig? = nil, architectureTraining: TrainingSpec? = nil,
        modelBytes: ((Int) -> Void)? = nil,
        devices inspect: ((URL) throws -> Void)? = nil, secure: SecureAggregationConfig? = nil, cycles: (([CycleRecord]) -> Void)? = nil
    ) async throws -> (initial: Evaluation, rounds: [RoundMetrics]) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-fleet-test-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let clock = ManualClock()
        let instance = try await CoordinatorInstance.open(
            // A fleet from one loopback address in open mode: the exposed coordinator's abuse limits do not apply.
            database: directory.appendingPathComponent("c.sqlite").path,
            configuration: CoordinatorConfiguration(openAuthenticationRate: nil, maximumOpenWorkers: nil), clock: clock, random: SplitMix64(seed: 1),
            logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }
        )
        var process = FakeModel.process(
            goal: goal, overSelection: overSelection, cycleSeconds: cycleSeconds, minimumReports: minimumReports,
            clientConfig: clientConfig ?? FakeModel.clientConfig(updates: workload.updates, step: workload.step), training: architectureTraining
        )
        if let secure {
            process.serverConfig.secureAggregation = secure
            process.serverConfig.maximumSampleCount = 100
        }
        let coordinator = try await FleetCoordinator(coordinator: instance.coordinator, clock: clock, process: process)
        modelBytes?(try await coordinator.currentModel().count)
        if http {
            let server = try await instance.serve(port: 0)
            do {
                let outcome = try await fleet.run(
                    coordinator: coordinator, transport: try HTTPTransport(url: server.baseURL.absoluteString), workload: workload,
                    directory: directory.appendingPathComponent("devices"), wallClock: ManualClock()
                )
                await server.stop()
                return outcome
            } catch {
                await server.stop()
                throw error
            }
        }
        let transport = InProcessTransport(coordinator: instance.coordinator)
        let outcome = try await fleet.run(
            coordinator: coordinator, transport: transport, workload: workload, directory: directory.appendingPathComponent("devices"), wallClock: ManualClock()
        )
        try inspect?(directory.appendingPathComponent("devices"))
        cycles?(try await instance.coordinator.cycles(processID: coordinator.processID).cycles)
        return outcome
    }
}

/// The training settings the fake workload's devices trained with.
final class SeenSettings: Sendable {
    private let settings = Mutex<Set<TrainingConfigurationKey>>([])

    /// A training configuration without its per-device seed.
    struct TrainingConfigurationKey: Hashable, Sendable {
        var batchSize: Int
        var learningRate: Double
        var epochs: Int
        var maxUpdates: Int?
        var loss: LossType
    }

    func record(_ training: TrainingConfiguration) {
        let key = TrainingConfigurationKey(
            batchSize: training.batchSize, learningRate: training.optimizer.learningRate, epochs: training.epochs,
            maxUpdates: training.maxUpdates, loss: training.loss
        )
        settings.withLock { _ = $0.insert(key) }
    }

    var all: Set<TrainingConfigurationKey> { settings.withLock { $0 } }
}
