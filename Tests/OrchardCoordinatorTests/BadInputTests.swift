import OrchardSupport
import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

/// Builds safetensors bytes by hand (to produce dtypes and defects Orchard's encoder never writes).
private func rawSafetensors(_ tensors: [(name: String, dtype: String, shape: [Int], data: [UInt8])], metadata: [String: String]) -> [UInt8] {
    var header: [String: Any] = ["__metadata__": metadata]
    var offset = 0
    for tensor in tensors {
        header[tensor.name] = ["dtype": tensor.dtype, "shape": tensor.shape, "data_offsets": [offset, offset + tensor.data.count]]
        offset += tensor.data.count
    }
    let json = try! JSONSerialization.data(withJSONObject: header, options: [.sortedKeys])
    var out = [UInt8]()
    withUnsafeBytes(of: UInt64(json.count).littleEndian) { out.append(contentsOf: $0) }
    out += json
    for tensor in tensors { out += tensor.data }
    return out
}

@Suite(.serialized) struct BadInputTests {
    @Test func everyBadInputIsA4xxAndLeavesTheModelUnchanged() async throws {
        let harness = try await Harness.start(
            configuration: CoordinatorConfiguration(adminToken: Harness.adminToken, maximumReportBytes: 64 << 10, maximumMessageBytes: 4096))
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 2, minimum: 2, cycleLength: 600))
            let a = try await harness.device()
            let b = try await harness.device()
            let assignmentA = try await harness.join(a)
            let assignmentB = try await harness.join(b)
            let http = harness.http

            func expectError(_ result: HTTPResult, _ status: Int, _ code: String, _ label: String, sourceLocation: SourceLocation = #_sourceLocation) {
                #expect(result.status == status, "\(label): \(result.status) \(String(decoding: result.body, as: UTF8.self))", sourceLocation: sourceLocation)
                #expect(result.errorCode == code, "\(label)", sourceLocation: sourceLocation)
            }
            func report(_ body: [UInt8], token: String? = a.sessionToken) async throws -> HTTPResult {
                try await http.send("POST", Endpoint.report, body: body, token: token)
            }
            func envelope(_ diff: [TensorRecord], worker: String = a.workerID, key: String = assignmentA.requestKey, samples: Int = 5) -> [UInt8] {
                ReportEnvelope.encode(diff: diff, metadata: ReportMetadata(workerID: worker, requestKey: key, sampleCount: samples))
            }
            let metadataJSON = String(
                decoding: try WireCoding.encoder().encode(ReportMetadata(workerID: a.workerID, requestKey: assignmentA.requestKey, sampleCount: 5)),
                as: UTF8.self)

            // Authentication and identity.
            expectError(try await report(envelope(Fixture.diff(0.1)), token: nil), 401, "unauthorized", "no token")
            expectError(try await report(envelope(Fixture.diff(0.1)), token: "not.a.jwt"), 401, "unauthorized", "garbage token")
            expectError(
                try await report(envelope(Fixture.diff(0.1), worker: b.workerID, key: assignmentB.requestKey)), 403, "forbidden", "another worker's report")
            expectError(
                try await http.json(
                    "POST", Endpoint.cycleRequest, CycleRequest(workerID: "w_unknown", processName: "tiny", processVersion: SemanticVersion(1)),
                    token: a.sessionToken), 403, "forbidden", "unknown worker id")
            expectError(
                try await http.json(
                    "POST", Endpoint.cycleRequest, CycleRequest(workerID: a.workerID, processName: "nope", processVersion: SemanticVersion(1)),
                    token: a.sessionToken), 404, "unknown_process", "unknown process")
            expectError(try await http.send("GET", Endpoint.processes, token: "wrong"), 401, "unauthorized", "wrong admin token")

            // Metrics that would crowd out the fleet's in the cycle history and the dashboard, or overflow their means.
            for (metrics, what) in [
                (Dictionary(uniqueKeysWithValues: (0..<17).map { ("!\($0)", 1.0) }), "17 metrics"), (["lo\u{202E}ss": 1], "a bidi override in a name"),
                ([" log perplexity": -40], "a leading space"), (["loss": 1.7e308], "a huge value"),
            ] {
                let body = ReportEnvelope.encode(
                    diff: Fixture.diff(0.1),
                    metadata: ReportMetadata(workerID: a.workerID, requestKey: assignmentA.requestKey, sampleCount: 5, metrics: metrics))
                expectError(try await report(body), 400, "invalid_request", what)
            }

            // Request keys.
            expectError(try await report(envelope(Fixture.diff(0.1), key: assignmentB.requestKey)), 403, "invalid_request_key", "another device's key")
            expectError(try await report(envelope(Fixture.diff(0.1), key: "made-up")), 403, "invalid_request_key", "made-up key")
            expectError(
                try await http.send("GET", Endpoint.model(assignmentA.modelID) + "?request_key=\(assignmentB.requestKey)", token: a.sessionToken), 403,
                "invalid_request_key", "download with another key")
            expectError(try await http.send("GET", Endpoint.model(assignmentA.modelID), token: a.sessionToken), 400, "invalid_request", "download without key")

            // Diff contents.
            var renamed = Fixture.diff(0.1)
            renamed[2] = TensorRecord(name: "out.bias2", shape: [2], values: [0, 0])
            expectError(try await report(envelope(renamed)), 422, "tensor_mismatch", "wrong tensor name")
            expectError(try await report(envelope(Array(Fixture.diff(0.1).dropLast()))), 422, "tensor_mismatch", "missing tensor")
            var reshaped = Fixture.diff(0.1)
            reshaped[1] = TensorRecord(name: "out.weight", shape: [4], values: [0, 0, 0, 0])
            expectError(try await report(envelope(reshaped)), 422, "shape_mismatch", "wrong shape")
            for bad in [Float.nan, .infinity] {
                var poisoned = Fixture.diff(0.1)
                poisoned[1].values[2] = bad
                expectError(try await report(envelope(poisoned)), 422, "non_finite_values", "\(bad)")
            }
            var frozen = Fixture.diff(0.1)
            frozen[0].values[0] = 0.5
            expectError(try await report(envelope(frozen)), 422, "frozen_tensor_changed", "frozen layer changed")
            expectError(try await report(envelope(Fixture.diff(0.1), samples: 0)), 422, "invalid_sample_count", "zero samples")
            expectError(try await report(envelope(Fixture.diff(0.1), samples: 2_000_000)), 422, "invalid_sample_count", "too many samples")
            let f64 = rawSafetensors(
                [
                    ("embed.weight", "F64", [2, 3], [UInt8](repeating: 0, count: 48)),
                    ("out.bias", "F64", [2], [UInt8](repeating: 0, count: 16)),
                    ("out.weight", "F64", [2, 2], [UInt8](repeating: 0, count: 32)),
                ], metadata: [ReportEnvelope.metadataKey: metadataJSON])
            expectError(try await report(f64), 422, "dtype_mismatch", "F64 diff")

            // Malformed bodies.
            expectError(try await report([1, 2, 3]), 400, "malformed_safetensors", "three bytes")
            var truncated = envelope(Fixture.diff(0.1))
            truncated.removeLast(5)
            expectError(try await report(truncated), 400, "malformed_safetensors", "truncated safetensors")
            expectError(try await report(Safetensors.encode(Fixture.diff(0.1))), 400, "invalid_request", "no report metadata")
            expectError(try await report([UInt8](repeating: 0, count: 70 << 10)), 413, "payload_too_large", "oversized report")
            expectError(try await http.send("POST", Endpoint.authenticate, body: Array("{\"process_name\":".utf8)), 400, "malformed_json", "truncated JSON")
            expectError(
                try await http.send("POST", Endpoint.authenticate, body: Array("{\"process_name\":\"tiny\"}".utf8)), 400, "malformed_json", "missing field")
            expectError(
                try await http.send(
                    "POST", Endpoint.authenticate, body: Array("{\"process_name\":\"tiny\",\"process_version\":\"one\",\"protocol_version\":\"1\"}".utf8)), 400,
                "malformed_json", "bad version")
            expectError(
                try await http.json(
                    "POST", Endpoint.authenticate,
                    AuthenticateRequest(processName: "tiny", processVersion: SemanticVersion(1), protocolVersion: SemanticVersion(1))), 400,
                "unsupported_version", "protocol 1")
            expectError(
                try await http.send("POST", Endpoint.authenticate, body: [UInt8](repeating: 32, count: 5000)), 413, "payload_too_large", "oversized JSON")
            expectError(try await http.send("GET", "/v1/nothing"), 404, "not_found", "unknown route")
            var badProcess = Fixture.host(name: "bad")
            badProcess.serverConfig.goalCount = 0
            expectError(try await http.json("POST", Endpoint.processes, badProcess, token: Harness.adminToken), 400, "invalid_configuration", "goal 0")
            var badWeights = Fixture.host(name: "bad")
            badWeights.initialWeights = [9, 9, 9]
            expectError(
                try await http.json("POST", Endpoint.processes, badWeights, token: Harness.adminToken), 400, "malformed_safetensors", "bad initial weights")

            // Nothing above changed the model or counted as a report.
            var status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.reported == 0)
            #expect(status.latestCheckpoint == 0)

            // A good report is accepted once; resending it is refused; after the deadline the other is refused.
            #expect(try await report(envelope(Fixture.diff(0.1))).status == 200)
            expectError(try await report(envelope(Fixture.diff(0.1))), 409, "report_already_received", "reused key")
            harness.clock.advance(bySeconds: 601)
            expectError(
                try await report(envelope(Fixture.diff(0.1), worker: b.workerID, key: assignmentB.requestKey), token: b.sessionToken), 409, "deadline_passed",
                "after the deadline")
            await harness.coordinator.tick()
            status = try await harness.status(hosted.processID)
            #expect(status.cyclesAbandoned == 1)
            #expect(status.latestCheckpoint == 0)
            expectClose(try await harness.checkpoint(hosted.processID), Dictionary(uniqueKeysWithValues: Fixture.weights.map { ($0.name, $0.values) }))
        }
    }
}
