import Foundation
@testable import OrchardCoordinator
import OrchardData
import OrchardFormats
import OrchardML
import OrchardProtocol
import OrchardTesting
import Testing

/// Server-side evaluation over loopback HTTP with a real SQLite file: held-out data attached to a process, and every
/// published checkpoint evaluated on it.
@Suite(.serialized) struct ServerEvaluationTests {
    /// A regressor with a training section (its loss is the evaluation's).
    static let model = ModelSpec(
        name: "evaluated", inputs: [InputSpec(name: "x", shape: [3])],
        layers: [LayerSpec(name: "out", type: .dense, inputs: ["x"], units: 1, inputSize: 3, useBias: true)],
        training: TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.1), epochs: 1, batchSize: 4))
    static let weights = [
        TensorRecord(name: "out.bias", shape: [1], values: [0.1]),
        TensorRecord(name: "out.weight", shape: [1, 3], values: [0.5, -0.25, 1]),
    ]

    static func data(samples: Int = 5, width: Int = 3) throws -> [UInt8] {
        let inputs = (0..<(samples * width)).map { Float($0 % 7) / 7 - 0.3 }
        let targets = (0..<samples).map { Float($0) * 0.4 - 0.5 }
        return DeviceDataFile.encode(
            try TensorDataset(inputs: ["x": Tensor(shape: [samples, width], scalars: inputs)], targets: Tensor(shape: [samples, 1], scalars: targets)))
    }

    static func host(goal: Int = 1) -> HostProcessRequest {
        HostProcessRequest(
            name: "evaluated", version: SemanticVersion(1, 0), model: model, initialWeights: Safetensors.encode(weights), clientConfig: ClientConfig(),
            serverConfig: ServerConfig(goalCount: goal, overSelection: 1, minimumReports: 1, checkpointRetention: 5))
    }

    /// What the engine (as `orchard evaluate` calls it) measures for `weights` on `data`.
    static func expected(_ weights: [UInt8], _ data: [UInt8]) throws -> [String: Double] {
        var built = try Model(spec: model)
        try built.loadWeights(safetensors: weights)
        let metrics = try built.evaluationMetrics(on: try DeviceDataFile.decode(data), loss: .meanSquaredError)
        return metrics.values.merging(["loss": metrics.loss]) { _, loss in loss }
    }

    static func attach(_ harness: Harness, _ processID: String, _ bytes: [UInt8], token: String? = Harness.adminToken) async throws -> HTTPResult {
        try await harness.http.send(
            "PUT", Endpoint.evaluation(processID), body: bytes, token: token, headers: ["Content-Type": "application/octet-stream"])
    }

    /// One device's report of `scale` × (1, 2, 3) and (4) on the weight and bias: the cycle (goal 1) closes.
    static func publish(_ harness: Harness, scale: Float) async throws {
        let device = try await harness.device(name: "evaluated")
        guard case .accepted(let assignment) = try await harness.requestCycle(device, name: "evaluated") else {
            throw HarnessError(description: "the device was turned away")
        }
        let diff = [
            TensorRecord(name: "out.bias", shape: [1], values: [4 * scale]),
            TensorRecord(name: "out.weight", shape: [1, 3], values: [scale, 2 * scale, 3 * scale]),
        ]
        #expect(try await harness.report(device, assignment, diff: diff, samples: 3).status == 200)
    }

    static func checkpointBytes(_ harness: Harness, _ processID: String, _ number: Int) async throws -> [UInt8] {
        try await harness.http.send("GET", Endpoint.checkpoint(processID, "\(number)"), token: Harness.adminToken).body
    }

    @Test func everyPublishedCheckpointIsEvaluatedOnTheAttachedData() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host())
            #expect(try await harness.status(hosted.processID).evaluation == nil)
            let data = try Self.data()
            let attached = try await Self.attach(harness, hosted.processID, data)
            #expect(attached.status == 200, "\(String(decoding: attached.body, as: UTF8.self))")
            let answer = try attached.decode(ProcessEvaluations.self)
            #expect(answer.dataBytes == data.count && answer.dataSamples == 5)
            #expect(answer.evaluations.map(\.checkpoint) == [0])
            #expect(answer.evaluations.first?.metrics == (try Self.expected(Safetensors.encode(Self.weights), data)))
            #expect(Set(answer.evaluations.first?.metrics.keys ?? [:].keys) == ["loss", "rmse", "mae"])

            for scale: Float in [0.1, -0.2] { try await Self.publish(harness, scale: scale) }
            await harness.coordinator.evaluationsSettled()
            let listed = try await harness.http.send("GET", Endpoint.evaluation(hosted.processID), token: Harness.adminToken).decode(ProcessEvaluations.self)
            #expect(listed.evaluations.map(\.checkpoint) == [0, 1, 2])
            for evaluation in listed.evaluations {
                #expect(evaluation.samples == 5)
                let expected = try Self.expected(try await Self.checkpointBytes(harness, hosted.processID, evaluation.checkpoint), data)
                #expect(evaluation.metrics == expected, "checkpoint \(evaluation.checkpoint)")
            }
            #expect(listed.evaluations[1].metrics != listed.evaluations[2].metrics)
            #expect(try await harness.status(hosted.processID).evaluation == listed.evaluations.last)
            let metrics = String(decoding: try await harness.http.send("GET", Endpoint.metrics).body, as: UTF8.self)
            #expect(metrics.contains(#"orchard_evaluation_checkpoint{"#) && metrics.contains(#"metric="rmse""#), "\(metrics)")
        }
    }

    /// The server's evaluation of a checkpoint equals `orchard evaluate --json` on the same files.
    @Test func theServersEvaluationEqualsOrchardEvaluate() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host())
            let data = try Self.data(samples: 9)
            #expect(try await Self.attach(harness, hosted.processID, data).status == 200)
            try await Self.publish(harness, scale: 0.3)
            await harness.coordinator.evaluationsSettled()
            let server = try #require(try await harness.status(hosted.processID).evaluation)
            #expect(server.checkpoint == 1)
            let directory = harness.directory.appendingPathComponent("evaluate-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try Self.model.jsonData().write(to: directory.appendingPathComponent("model.json"))
            try Data(try await Self.checkpointBytes(harness, hosted.processID, 1)).write(to: directory.appendingPathComponent("weights.safetensors"))
            try Data(data).write(to: directory.appendingPathComponent("data.safetensors"))
            let run = try await OrchardExecutable.run(
                ["evaluate", "--model", "model.json", "--weights", "weights.safetensors", "--data", "data.safetensors", "--json"], in: directory)
            #expect(run.status == 0, "\(run.error)")
            let printed = try JSONDecoder().decode([String: Double].self, from: Data(run.output.utf8))
            #expect(printed["samples"] == Double(server.samples))
            #expect(printed.filter { $0.key != "samples" } == server.metrics)
        }
    }

    @Test func badDataIsRefusedWithItsReason() async throws {
        var configuration = CoordinatorConfiguration(adminToken: Harness.adminToken)
        configuration.maximumEvaluationDataBytes = 4096
        let harness = try await Harness.start(configuration: configuration)
        try await harness.stopping {
            let hosted = try await harness.host(Self.host())
            func refusal(_ bytes: [UInt8], processID: String? = nil, token: String? = Harness.adminToken) async throws -> (Int, String?, String) {
                let result = try await Self.attach(harness, processID ?? hosted.processID, bytes, token: token)
                return (result.status, result.errorCode, (try? result.decode(ErrorBody.self).error.message) ?? "")
            }
            let big = try await refusal([UInt8](repeating: 7, count: 5000))
            #expect(big.0 == 413 && big.1 == "payload_too_large")
            let garbage = try await refusal(Array("not a data file".utf8))
            #expect(garbage.0 == 400 && garbage.1 == "invalid_request" && garbage.2.contains("not a file `orchard data prepare` writes"), "\(garbage)")
            let wrongWidth = try await refusal(try Self.data(width: 4))
            #expect(wrongWidth.0 == 400 && wrongWidth.1 == "invalid_request" && wrongWidth.2.contains("does not fit model 'evaluated'"), "\(wrongWidth)")
            // Targets that do not fit the regressor's one output, or are not finite: refused, the coordinator still up.
            let inputs = (0..<6).map { Float($0) / 6 }
            for targets in [Tensor(shape: [2, 2], scalars: [0, 1, 1, 0]), Tensor(shape: [2, 1], scalars: [0.5, .nan])] {
                let bad = DeviceDataFile.encode(try TensorDataset(inputs: ["x": Tensor(shape: [2, 3], scalars: inputs)], targets: targets))
                let refused = try await refusal(bad)
                #expect(refused.0 == 400 && refused.1 == "invalid_request" && refused.2.contains("does not fit model 'evaluated'"), "\(refused)")
            }
            let unknown = try await refusal(try Self.data(), processID: "no-such-process")
            #expect(unknown.0 == 404 && unknown.1 == "unknown_process")
            let anonymous = try await refusal(try Self.data(), token: nil)
            #expect(anonymous.0 == 401)
            let forged = try await refusal(try Self.data(), token: "forged-admin-token")
            #expect(forged.0 == 401)
            // A model without a training section has no loss to evaluate with.
            let untrained = try await harness.host(Fixture.host())
            var input = [Float](repeating: 0.5, count: 6)
            input[0] = 1
            let fixtureData = DeviceDataFile.encode(
                try TensorDataset(inputs: ["x": Tensor(shape: [2, 3], scalars: input)], targets: Tensor(shape: [2, 2], scalars: [0, 1, 1, 0])))
            let noLoss = try await refusal(fixtureData, processID: untrained.processID)
            #expect(noLoss.0 == 400 && noLoss.2.contains("no training section"), "\(noLoss)")
            // Nothing was attached by any of them.
            let listed = try await harness.http.send("GET", Endpoint.evaluation(hosted.processID), token: Harness.adminToken).decode(ProcessEvaluations.self)
            #expect(listed.dataBytes == nil && listed.evaluations.isEmpty)
        }
    }

    @Test func theDataSurvivesARestartIsDetachableAndIsDeletedWithItsProcess() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host())
            let data = try Self.data()
            #expect(try await Self.attach(harness, hosted.processID, data).status == 200)
            try await harness.restart()
            try await Self.publish(harness, scale: 0.5)
            await harness.coordinator.evaluationsSettled()
            #expect(try await harness.status(hosted.processID).evaluation?.checkpoint == 1)
            // Detached: the history stays, the next checkpoint is not evaluated.
            let detached = try await harness.http.send("DELETE", Endpoint.evaluation(hosted.processID), token: Harness.adminToken)
            #expect(detached.status == 204)
            try await Self.publish(harness, scale: 0.5)
            await harness.coordinator.evaluationsSettled()
            let listed = try await harness.http.send("GET", Endpoint.evaluation(hosted.processID), token: Harness.adminToken).decode(ProcessEvaluations.self)
            #expect(listed.dataBytes == nil && listed.evaluations.map(\.checkpoint) == [0, 1])
            // Deleted with the process.
            #expect(try await Self.attach(harness, hosted.processID, data).status == 200)
            #expect(try await harness.http.send("DELETE", Endpoint.process(hosted.processID), token: Harness.adminToken).status == 204)
            #expect(try await harness.coordinator.store.evaluationData(processID: hosted.processID) == nil)
            #expect(try await harness.coordinator.store.evaluations(processID: hosted.processID, limit: 10).isEmpty)
            let gone = try await harness.http.send("GET", Endpoint.evaluation(hosted.processID), token: Harness.adminToken)
            #expect(gone.status == 404 && gone.errorCode == "unknown_process")
        }
    }
}
