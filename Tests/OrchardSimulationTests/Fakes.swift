import Foundation
import Logging
import OrchardClient
import OrchardCoordinator
import OrchardFormats
import OrchardInProcess
import OrchardProtocol
@testable import OrchardSimulation

/// A workload whose "training" pulls a three-number weight toward the device's own optimum, a fraction per
/// update; its checkpoint is the weight reached and the updates done.
struct FakeWorkload: FleetWorkload {
    let optima: [[Float]]
    let samples: [Int]
    let updates: Int
    let step: Float

    func updatesPerRound(device: Int) -> Int { updates }

    func sampleCount(device: Int) -> Int { samples[device] }

    func train(device: Int, weights: [TensorRecord], seed: UInt64, resumingFrom checkpoint: [UInt8]?, until target: Int) throws(SimulationError) -> LocalTrainingStretch {
        let start = try FakeModel.values(weights)
        var w = start
        var done = 0
        if let checkpoint {
            let archive = try FakeModel.archive(checkpoint)
            w = try FakeModel.values(archive.tensors)
            done = Int(archive.metadata["updates"] ?? "") ?? -1
        }
        while done < min(target, updates) {
            for i in w.indices { w[i] += step * (optima[device][i] - w[i]) }
            done += 1
        }
        if done < updates {
            return .paused(checkpoint: Safetensors.encode(FakeModel.records(w), metadata: ["updates": String(done)]))
        }
        return .finished(diff: FakeModel.records(zip(w, start).map { $0 - $1 }), loss: 0)
    }

    func updatesDone(device: Int, in checkpoint: [UInt8]) throws(SimulationError) -> Int {
        guard let done = Int(try FakeModel.archive(checkpoint).metadata["updates"] ?? "") else {
            throw SimulationError(.training, "the fake checkpoint has no update count")
        }
        return done
    }

    func evaluate(model: [UInt8]) async throws(SimulationError) -> Evaluation {
        let w = try FakeModel.values(FakeModel.archive(model).tensors)
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
    static let spec = ModelSpec(name: "fake", inputs: [InputSpec(name: "x", shape: [1])], layers: [
        LayerSpec(name: "w", type: .dense, inputs: ["x"], units: 3, inputSize: 1, useBias: false),
    ])

    static func records(_ values: [Float]) -> [TensorRecord] { [TensorRecord(name: "w.weight", shape: [3, 1], values: values)] }

    static func archive(_ bytes: [UInt8]) throws(SimulationError) -> SafetensorsArchive {
        do { return try Safetensors.decode(bytes) } catch { throw SimulationError(.training, "bad fake model: \(error)") }
    }

    static func values(_ tensors: [TensorRecord]) throws(SimulationError) -> [Float] {
        guard let w = tensors.first(where: { $0.name == "w.weight" }) else { throw SimulationError(.training, "no w.weight") }
        return w.values
    }

    static func process(goal: Int, overSelection: Double, cycleSeconds: Double, minimumReports: Int) -> HostProcessRequest {
        HostProcessRequest(
            name: "fake", version: SemanticVersion(1, 0), model: spec, initialWeights: Safetensors.encode(records([0, 0, 0])),
            clientConfig: ClientConfig(batchSize: 1, learningRate: 0.1, localEpochs: 1),
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
        minimumReports: Int = 1, http: Bool = false, modelBytes: ((Int) -> Void)? = nil
    ) async throws -> (initial: Evaluation, rounds: [RoundMetrics]) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-fleet-test-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let clock = ManualWallClock()
        let instance = try await CoordinatorInstance.open(
            database: directory.appendingPathComponent("c.sqlite").path, clock: .manual(clock), random: SplitMix64(seed: 1),
            logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }
        )
        let coordinator = try await FleetCoordinator(
            coordinator: instance.coordinator, clock: clock,
            process: FakeModel.process(goal: goal, overSelection: overSelection, cycleSeconds: cycleSeconds, minimumReports: minimumReports)
        )
        modelBytes?(try await coordinator.currentModel().count)
        if http {
            let server = try await instance.serve(port: 0)
            do {
                let outcome = try await fleet.run(
                    coordinator: coordinator, transport: try HTTPTransport(url: server.baseURL.absoluteString), workload: workload,
                    directory: directory.appendingPathComponent("devices"), now: { 0 }
                )
                await server.stop()
                return outcome
            } catch {
                await server.stop()
                throw error
            }
        }
        let transport = InMemoryTransport(coordinator: InProcessCoordinatorAdapter(coordinator: instance.coordinator))
        return try await fleet.run(coordinator: coordinator, transport: transport, workload: workload, directory: directory.appendingPathComponent("devices"), now: { 0 })
    }
}
