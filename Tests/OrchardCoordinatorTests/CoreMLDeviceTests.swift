import Foundation
@testable import OrchardCoordinator
import OrchardCoreML
import OrchardFormats
import OrchardProtocol
import OrchardTesting
import Testing

/// A Core ML device in a federation: it downloads the cycle's model as an updatable `.mlmodel`, its weights are
/// changed by coremltools (standing in for `MLUpdateTask`), and its report — the diff against what it received — is
/// aggregated with an Orchard-engine device's in one cycle.
@Suite struct CoreMLDeviceTests {
    /// Adds `scale × (i + 1)` to the i-th value of the weights and bias of the inner-product layer `layer`, with coremltools.
    static func editWithCoreMLTools(_ input: URL, _ output: URL, layer: String, scale: Double) async throws {
        let script = """
            import sys, coremltools
            spec = coremltools.utils.load_spec(sys.argv[1])
            nn = getattr(spec, spec.WhichOneof("Type"))
            (l,) = [l for l in nn.layers if l.name == sys.argv[3]]
            for params in (l.innerProduct.weights, l.innerProduct.bias):
                for i in range(len(params.floatValue)):
                    params.floatValue[i] += float(sys.argv[4]) * (i + 1)
            coremltools.utils.save_spec(spec, sys.argv[2])
            """
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", script, input.path, output.path, layer, String(scale)]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        await process.exited()
        guard process.terminationStatus == 0 else { throw HarnessError(description: "coremltools could not edit \(input.path)") }
    }

    @Test(PythonModules.requirement(["coremltools"])) func aCoreMLDeviceAndAnOrchardDeviceReportToOneCycle() async throws {
        try PythonModules.require(["coremltools"])
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 2, minimum: 2, overSelection: 1))

            // The Orchard-engine device reports its diff as usual.
            let engine = try await harness.device()
            let engineAssignment = try await harness.join(engine)
            #expect(try await harness.report(engine, engineAssignment, diff: Fixture.diff(0.1), samples: 5).status == 200)

            // The Core ML device downloads the model as .mlmodel, with the process's training settings.
            let coreML = try await harness.device()
            let assignment = try await harness.join(coreML)
            let path = Endpoint.model(assignment.modelID) + "?\(Endpoint.requestKeyQuery)=\(assignment.requestKey)&\(Endpoint.formatQuery)=mlmodel"
            let download = try await harness.http.send("GET", path, token: coreML.sessionToken)
            #expect(download.status == 200)
            #expect(download.header("Content-Type") == "application/octet-stream")
            let etag = try #require(download.header("ETag"))
            #expect(etag == "\"\(hosted.processID).0.mlmodel\"")
            let served = try CoreMLImporter().importModel(from: download.body)
            #expect(served.spec.layers.map(\.name) == ["embed", "out"] && served.spec.layers[0].frozen)
            #expect(served.spec.training == TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.05), epochs: 1, batchSize: 4))
            #expect(served.weights.map(\.values) == Fixture.weights.map(\.values))
            // Range and If-None-Match work as for safetensors.
            let part = try await harness.http.send("GET", path, token: coreML.sessionToken, headers: ["Range": "bytes=0-15"])
            #expect(part.status == 206 && part.body == Array(download.body.prefix(16)))
            #expect(try await harness.http.send("GET", path, token: coreML.sessionToken, headers: ["If-None-Match": etag]).status == 304)

            // "Training": coremltools changes the updatable layer's weights; the SDK's diff is the change.
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-coreml-device-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let received = directory.appendingPathComponent("received.mlmodel"), updated = directory.appendingPathComponent("updated.mlmodel")
            try Data(download.body).write(to: received)
            try await Self.editWithCoreMLTools(received, updated, layer: "out", scale: 0.3)
            let diff = try CoreMLUpdateDiff.diff(received: download.body, updated: [UInt8](Data(contentsOf: updated)))
            let expectedDiff = Fixture.diff(0.3)
            for (tensor, expected) in zip(diff, expectedDiff) {
                #expect(tensor.name == expected.name && tensor.shape == expected.shape)
                #expect(zip(tensor.values, expected.values).allSatisfy { abs($0 - $1) < 1e-6 }, "\(tensor.name): \(tensor.values)")
            }
            #expect(diff.first { $0.name == "embed.weight" }?.values.allSatisfy { $0 == 0 } == true, "the frozen layer is unchanged")
            #expect(try await harness.report(coreML, assignment, diff: diff, samples: 15).status == 200)

            // One cycle aggregated both: initial + (5 · engine + 15 · Core ML) / 20.
            await harness.coordinator.tick()
            let checkpoint = try await harness.checkpoint(hosted.processID)
            let engineDiff = Dictionary(uniqueKeysWithValues: Fixture.diff(0.1).map { ($0.name, $0.values) })
            let coreMLDiff = Dictionary(uniqueKeysWithValues: diff.map { ($0.name, $0.values) })
            for tensor in Fixture.weights {
                let values = try #require(checkpoint[tensor.name])
                for i in values.indices {
                    let expected = Double(tensor.values[i]) + (5 * Double(engineDiff[tensor.name]![i]) + 15 * Double(coreMLDiff[tensor.name]![i])) / 20
                    #expect(abs(Double(values[i]) - expected) < 1e-5, "\(tensor.name)[\(i)]")
                }
            }
        }
    }

    @Test func aModelCoreMLCannotExpressOrAnUnknownFormatIsRefused() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Fixture.host()
            request.clientConfig.maxUpdates = 3  // Core ML's update parameters have no cap on updates.
            _ = try await harness.host(request)
            let device = try await harness.device()
            let assignment = try await harness.join(device)
            let base = Endpoint.model(assignment.modelID) + "?\(Endpoint.requestKeyQuery)=\(assignment.requestKey)"
            let refused = try await harness.http.send("GET", base + "&\(Endpoint.formatQuery)=mlmodel", token: device.sessionToken)
            #expect(refused.status == 422 && refused.errorCode == "unsupported_format")
            #expect((try? refused.decode(ErrorBody.self))?.error.message.contains("no update cap") == true, "\(String(decoding: refused.body, as: UTF8.self))")
            // Asked again, the refusal is the one made for this checkpoint: the checkpoint is not decoded and exported again.
            let again = try await harness.http.send("GET", base + "&\(Endpoint.formatQuery)=mlmodel", token: device.sessionToken)
            #expect(again.status == 422 && again.errorCode == "unsupported_format")
            #expect(await harness.coordinator.coreMLExportAttempts == 1)
            let unknown = try await harness.http.send("GET", base + "&\(Endpoint.formatQuery)=onnx", token: device.sessionToken)
            #expect(unknown.status == 400 && unknown.errorCode == "invalid_request")
            #expect((try? unknown.decode(ErrorBody.self))?.error.message.contains("safetensors, mlmodel") == true)
            let empty = try await harness.http.send("GET", base + "&\(Endpoint.formatQuery)=", token: device.sessionToken)
            #expect(empty.status == 400 && empty.errorCode == "invalid_request")
            let long = try await harness.http.send("GET", base + "&\(Endpoint.formatQuery)=" + String(repeating: "x", count: 2000), token: device.sessionToken)
            #expect(long.status == 400 && (try? long.decode(ErrorBody.self))?.error.message.count ?? .max < 200, "the value is not echoed whole")
            // Another worker's session cannot fetch this assignment's model in either format.
            let other = try await harness.device()
            let foreign = try await harness.http.send("GET", base + "&\(Endpoint.formatQuery)=mlmodel", token: other.sessionToken)
            #expect(foreign.status == 403 && foreign.errorCode == "invalid_request_key")
            // The safetensors download is unaffected.
            #expect(try await harness.http.send("GET", base, token: device.sessionToken).status == 200)
        }
    }
}
