import Foundation
import JWTKit
import OrchardCoordinator
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Testing

private struct DeviceClaims: JWTPayload {
    var sub: SubjectClaim
    var exp: ExpirationClaim
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// `openapi.json` against the server: the document is consistent, and a real loopback session that exercises every
/// operation (successes and every kind of refusal) exchanges only what the document allows (see ``HTTP``, which
/// checks every exchange of every integration test the same way).
@Suite(.serialized) struct OpenAPIConformanceTests {
    static let deviceSecret = "device-secret-of-at-least-32-bytes!!"

    /// A device JWT signed with ``deviceSecret``.
    static func deviceToken(subject: String, expires: Date) async throws -> String {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: deviceSecret), digestAlgorithm: .sha256)
        return try await keys.sign(DeviceClaims(sub: SubjectClaim(value: subject), exp: ExpirationClaim(value: expires)))
    }

    @Test func theDocumentIsConsistentWithItselfTheEndpointsAndTheErrorCodes() throws {
        let conformance = Conformance.document
        let problems = conformance.documentProblems { CoordinatorError.status(of: WireErrorCode($0)) }
        #expect(problems.isEmpty, "\(problems.joined(separator: "\n"))")

        // Every endpoint of Endpoints.swift has a path, and the document has no other.
        let endpoints: Set<String> = [
            Endpoint.health, Endpoint.metrics, Endpoint.openAPI, Endpoint.authenticate, Endpoint.cycleRequest,
            Endpoint.model("{model_id}"), Endpoint.plan("{plan_id}"), Endpoint.report, Endpoint.speedTest, Endpoint.processes,
            Endpoint.process("{process_id}"), Endpoint.checkpoint("{process_id}", "{checkpoint}"), Endpoint.secureAggregation,
            Endpoint.cycles("{process_id}"), Endpoint.evaluation("{process_id}"), Endpoint.evaluationReport,
        ]
        #expect(Set((conformance.document["paths"]?.objectValue ?? [:]).keys) == endpoints)

        // The ErrorCode schema lists exactly the codes the coordinator sends, and info.version is the wire protocol's.
        var listed: [String] = []
        if case .array(let codes)? = conformance.document["components"]?["schemas"]?["ErrorCode"]?["enum"] { listed = codes.compactMap(\.stringValue) }
        #expect(listed.count == Set(listed).count && Set(listed) == Set(WireErrorCode.allKnown.map(\.rawValue)))
        #expect(WireErrorCode.allKnown.count == Set(WireErrorCode.allKnown).count)
        #expect(conformance.document["info"]?["version"]?.stringValue == WireProtocol.version.description)
        #expect(conformance.document["openapi"]?.stringValue?.hasPrefix("3.0.") == true)
    }

    @Test func theValidatorCatchesWhatTheDocumentForbids() throws {
        let conformance = Conformance.document
        let authenticated = HTTPExchange(
            method: "POST", target: Endpoint.authenticate, requestHeaders: ["Content-Type": MediaType.json],
            requestBody: Array(#"{"process_name":"tiny","process_version":"1.0","protocol_version":"2.0.0"}"#.utf8), status: 200,
            responseHeaders: ["Content-Type": MediaType.json],
            responseBody: Array(
                #"{"expires_in":60,"protocol_version":"2.0.0","requires_speed_test":false,"session_token":"a.b.c","worker_id":"w_0123456789abcdef01234567"}"#
                    .utf8)
        )
        #expect(conformance.problems(with: authenticated).isEmpty, "\(conformance.problems(with: authenticated))")

        func expectProblem(_ exchange: HTTPExchange, _ fragment: String, sourceLocation: SourceLocation = #_sourceLocation) {
            let problems = conformance.problems(with: exchange)
            #expect(problems.contains { $0.contains(fragment) }, "\(problems)", sourceLocation: sourceLocation)
        }
        var missing = authenticated
        missing.responseBody = Array(#"{"expires_in":60,"protocol_version":"2.0.0","requires_speed_test":false,"session_token":"a.b.c"}"#.utf8)
        expectProblem(missing, "required property 'worker_id' is missing")
        var badPattern = authenticated
        badPattern.responseBody = Array(
            #"{"expires_in":60,"protocol_version":"2.0.0","requires_speed_test":false,"session_token":"a.b.c","worker_id":"worker-1"}"#.utf8)
        expectProblem(badPattern, "does not match")
        var extra = authenticated
        extra.responseBody = Array(
            #"{"expires_in":60,"protocol_version":"2.0.0","requires_speed_test":false,"session_token":"a.b.c","worker_id":"w_0123456789abcdef01234567","x":1}"#
                .utf8)
        expectProblem(extra, "property 'x' is not allowed")
        var undocumentedStatus = authenticated
        undocumentedStatus.status = 409
        expectProblem(undocumentedStatus, "status 409 is not documented")
        var wrongCode = authenticated
        wrongCode.status = 404
        wrongCode.responseBody = Array(#"{"error":{"code":"unknown_worker","message":"m"}}"#.utf8)
        expectProblem(wrongCode, "not among this response's x-error-codes")
        var acceptedInvalid = authenticated
        acceptedInvalid.requestBody = Array(#"{"process_name":"","process_version":"1.0.0.0.0","protocol_version":"2"}"#.utf8)
        expectProblem(acceptedInvalid, "accepted a request whose body $.process_name: length 0 is below minLength 1")
        expectProblem(acceptedInvalid, "accepted a request whose body $.process_version")
        var unknownPath = authenticated
        unknownPath.target = "/v1/device/nothing"
        expectProblem(unknownPath, "not a documented operation")
        var badQuery = HTTPExchange(
            method: "GET", target: Endpoint.speedTest + "?bytes=0", requestHeaders: [:], requestBody: nil, status: 200,
            responseHeaders: ["Content-Type": "application/octet-stream"], responseBody: [0x5A])
        expectProblem(badQuery, "query parameter bytes: 0 is below the minimum 1")
        badQuery.target = Endpoint.speedTest + "?bytes=10"
        #expect(conformance.problems(with: badQuery).isEmpty)
    }

    /// Every numeric bound the document states for the client, server and aggregator configuration, read from the
    /// document itself: a value on the bound is hosted (201), a value just past it is refused (400
    /// invalid_configuration). So the document says no less and no more than the server enforces.
    @Test func everyDocumentedConfigurationBoundIsTheServersBound() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let schemas = try #require(Conformance.document.document["components"]?["schemas"]?.objectValue)
            let base = try JSONValue.parse(WireCoding.encoder().encode(Fixture.host()))
            var cases: [(path: [String], value: Double, accepted: Bool)] = []
            for (schema, path) in [
                ("ClientConfig", ["client_config"]), ("ServerConfig", ["server_config"]), ("AggregatorConfig", ["server_config", "aggregator"]),
            ] {
                for (field, property) in schemas[schema]?["properties"]?.objectValue ?? [:] {
                    let integer = property["type"]?.stringValue == "integer"
                    let step = integer ? 1 : 1e-6
                    if let minimum = property["minimum"]?.numberValue {
                        let exclusive = property["exclusiveMinimum"] == .bool(true)
                        cases.append((path + [field], exclusive ? minimum + step : minimum, true))
                        cases.append((path + [field], exclusive ? minimum : minimum - step, false))
                    }
                    if let maximum = property["maximum"]?.numberValue {
                        let exclusive = property["exclusiveMaximum"] == .bool(true)
                        cases.append((path + [field], exclusive ? maximum - step : maximum, true))
                        cases.append((path + [field], exclusive ? maximum : maximum + step, false))
                    }
                }
            }
            #expect(cases.count >= 40)
            func setting(_ value: JSONValue, at path: ArraySlice<String>, in json: JSONValue) -> JSONValue {
                guard case .object(var members) = json, let first = path.first else { return value }
                members[first] = setting(value, at: path.dropFirst(), in: members[first] ?? .object([:]))
                return .object(members)
            }
            for (index, bound) in cases.enumerated() {
                var body = setting(.string("bound-\(index)"), at: ["name"], in: base)
                body = setting(.number(bound.value), at: bound.path[...], in: body)
                if bound.path.last == "goal_count" || bound.path.last == "minimum_reports" {
                    // minimum_reports may not exceed goal_count: move the other one out of the way.
                    let other = bound.path.last == "goal_count" ? "minimum_reports" : "goal_count"
                    body = setting(.number(bound.path.last == "goal_count" ? 1 : 1_000_000), at: ["server_config", other], in: body)
                }
                let result = try await harness.http.send(
                    "POST", Endpoint.processes, body: Fuzz.json(body), token: Harness.adminToken, headers: ["Content-Type": MediaType.json])
                let label = "\(bound.path.joined(separator: ".")) = \(bound.value)"
                if bound.accepted {
                    #expect(result.status == 201, "\(label): \(result.status) \(String(decoding: result.body, as: UTF8.self))")
                } else {
                    #expect(
                        result.status == 400 && result.errorCode == "invalid_configuration",
                        "\(label): \(result.status) \(String(decoding: result.body, as: UTF8.self))")
                }
            }
            // Names: 200 characters are a name, 201 or a control character are not.
            for (name, accepted) in [
                (String(repeating: "é", count: 200), true), (String(repeating: "n", count: 201), false), ("tab\there", false), ("", false),
            ] {
                let result = try await harness.http.json("POST", Endpoint.processes, Fixture.host(name: name), token: Harness.adminToken)
                #expect(result.status == (accepted ? 201 : 400), "\(name.prefix(8))…: \(result.status)")
            }
        }
    }

    /// A session that exercises every documented operation and nearly every documented status; every exchange is
    /// checked by ``HTTP`` as it happens.
    @Test func aSessionOverEveryOperationConformsToTheDocument() async throws {
        var configuration = CoordinatorConfiguration(
            adminToken: Harness.adminToken, maximumReportBytes: 64 << 10, maximumAdminBodyBytes: 64 << 10, maximumMessageBytes: 4096)
        configuration.maximumEvaluationDataBytes = 4096
        let harness = try await Harness.start(configuration: configuration)
        try await harness.stopping {
            let http = harness.http
            let admin = Harness.adminToken
            func expectStatus(_ result: HTTPResult, _ status: Int, _ code: String? = nil, _ label: String, sourceLocation: SourceLocation = #_sourceLocation) {
                #expect(result.status == status, "\(label): \(result.status) \(String(decoding: result.body, as: UTF8.self))", sourceLocation: sourceLocation)
                if let code { #expect(result.errorCode == code, "\(label)", sourceLocation: sourceLocation) }
            }

            // Health, metrics and the document itself.
            expectStatus(try await http.send("GET", Endpoint.health), 200, nil, "health")
            expectStatus(try await http.send("GET", Endpoint.metrics), 200, nil, "metrics")
            let served = try await http.send("GET", Endpoint.openAPI)
            expectStatus(served, 200, nil, "openapi")
            #expect(served.body == OpenAPI.document)

            // Admin: hosting and its refusals.
            let hosted = try await harness.host(Fixture.host(goal: 1, minimum: 1, overSelection: 1))
            var gated = Fixture.host(name: "gated")
            gated.serverConfig.minimumDownloadMbps = 10
            gated.serverConfig.minimumUploadMbps = 1
            _ = try await harness.host(gated)
            var signed = Fixture.host(name: "signed")
            signed.serverConfig.authentication = .hs256(secret: Self.deviceSecret)
            let signedStatus = try await harness.host(signed)
            expectStatus(try await http.json("POST", Endpoint.processes, Fixture.host(), token: admin), 409, "process_exists", "duplicate")
            expectStatus(try await http.json("POST", Endpoint.processes, Fixture.host(name: "x"), token: nil), 401, "unauthorized", "no admin token")
            var badGoal = Fixture.host(name: "bad")
            badGoal.serverConfig.goalCount = 0
            expectStatus(try await http.json("POST", Endpoint.processes, badGoal, token: admin), 400, "invalid_configuration", "goal 0")
            var badWeights = Fixture.host(name: "bad")
            badWeights.initialWeights = [1, 2, 3]
            expectStatus(try await http.json("POST", Endpoint.processes, badWeights, token: admin), 400, "malformed_safetensors", "bad weights")
            expectStatus(try await http.send("POST", Endpoint.processes, body: Array("{".utf8), token: admin), 400, "malformed_json", "bad JSON")
            expectStatus(
                try await http.send("POST", Endpoint.processes, body: [UInt8](repeating: 0x20, count: 70 << 10), token: admin), 413, "payload_too_large",
                "oversized")
            expectStatus(try await http.send("GET", Endpoint.processes, token: admin), 200, nil, "list")
            expectStatus(try await http.send("GET", Endpoint.processes), 401, "unauthorized", "list without token")
            expectStatus(try await http.send("GET", Endpoint.process(hosted.processID), token: admin), 200, nil, "status")
            expectStatus(try await http.send("GET", Endpoint.process("p_nothing"), token: admin), 404, "unknown_process", "unknown status")
            expectStatus(try await http.send("GET", Endpoint.process(hosted.processID)), 401, "unauthorized", "status without token")
            expectStatus(try await http.send("GET", Endpoint.cycles(hosted.processID), token: admin), 200, nil, "cycles")
            expectStatus(try await http.send("GET", Endpoint.cycles("p_nothing"), token: admin), 404, "unknown_process", "cycles of an unknown process")
            expectStatus(try await http.send("GET", Endpoint.cycles(hosted.processID)), 401, "unauthorized", "cycles without token")

            // Server-side evaluation: held-out data attached, listed and detached.
            let evaluated = try await harness.host(ServerEvaluationTests.host())
            let heldOut = try ServerEvaluationTests.data()
            let octets = ["Content-Type": "application/octet-stream"]
            let evaluationPath = Endpoint.evaluation(evaluated.processID)
            expectStatus(try await http.send("PUT", evaluationPath, body: heldOut, token: admin, headers: octets), 200, nil, "attach evaluation data")
            expectStatus(try await http.send("PUT", evaluationPath, body: heldOut, headers: octets), 401, "unauthorized", "attach without token")
            expectStatus(
                try await http.send("PUT", Endpoint.evaluation("p_nothing"), body: heldOut, token: admin, headers: octets), 404, "unknown_process",
                "attach to an unknown process")
            expectStatus(
                try await http.send("PUT", evaluationPath, body: Array("not data".utf8), token: admin, headers: octets), 400, "invalid_request",
                "attach garbage")
            expectStatus(
                try await http.send("PUT", evaluationPath, body: [UInt8](repeating: 1, count: 5000), token: admin, headers: octets), 413, "payload_too_large",
                "attach too much")
            expectStatus(try await http.send("GET", evaluationPath, token: admin), 200, nil, "evaluations")
            expectStatus(try await http.send("GET", evaluationPath), 401, "unauthorized", "evaluations without token")
            expectStatus(
                try await http.send("GET", Endpoint.evaluation("p_nothing"), token: admin), 404, "unknown_process", "evaluations of an unknown process")
            expectStatus(try await http.send("DELETE", evaluationPath), 401, "unauthorized", "detach without token")
            expectStatus(try await http.send("DELETE", evaluationPath, token: admin), 204, nil, "detach")
            expectStatus(
                try await http.send("DELETE", Endpoint.evaluation("p_nothing"), token: admin), 404, "unknown_process", "detach from an unknown process")

            // Authentication.
            let device = try await harness.device()
            let other = try await harness.device()
            func authenticate(_ body: String) async throws -> HTTPResult {
                try await http.send("POST", Endpoint.authenticate, body: Array(body.utf8), headers: ["Content-Type": MediaType.json])
            }
            expectStatus(try await authenticate(#"{"process_name":"tiny"}"#), 400, "malformed_json", "missing fields")
            expectStatus(
                try await authenticate(#"{"process_name":"tiny","process_version":"1","protocol_version":"1.0"}"#), 400, "unsupported_version", "protocol 1")
            expectStatus(
                try await authenticate(#"{"process_name":"a\u0001b","process_version":"1","protocol_version":"2.0"}"#), 400, "invalid_request",
                "control character")
            expectStatus(
                try await authenticate(#"{"process_name":"nope","process_version":"1","protocol_version":"2.0"}"#), 404, "unknown_process", "unknown process")
            expectStatus(
                try await authenticate(#"{"process_name":"signed","process_version":"1","protocol_version":"2.0"}"#), 401, "unauthorized", "no device token")
            expectStatus(try await http.send("POST", Endpoint.authenticate, body: [UInt8](repeating: 0x20, count: 5000)), 413, "payload_too_large", "oversized")
            let jwt = try await Self.deviceToken(subject: "phone-1", expires: harness.clock.date.addingTimeInterval(3600))
            let signedDevice = try await http.json(
                "POST", Endpoint.authenticate, AuthenticateRequest(authToken: jwt, processName: "signed", processVersion: SemanticVersion(1)))
            expectStatus(signedDevice, 200, nil, "signed device")
            let gatedDevice = try await harness.device(name: "gated")

            // Cycle requests.
            func cycle(_ request: CycleRequest, token: String?) async throws -> HTTPResult {
                try await http.json("POST", Endpoint.cycleRequest, request, token: token)
            }
            let tiny = { (worker: String) in CycleRequest(workerID: worker, processName: "tiny", processVersion: SemanticVersion(1)) }
            let accepted = try await cycle(tiny(device.workerID), token: device.sessionToken)
            expectStatus(accepted, 200, nil, "accepted")
            guard case .accepted(let assignment) = try accepted.decode(CycleResponse.self) else {
                Issue.record("not accepted")
                return
            }
            let rejected = try await cycle(tiny(other.workerID), token: other.sessionToken)
            expectStatus(rejected, 200, nil, "cycle full")
            #expect(String(decoding: rejected.body, as: UTF8.self).contains("\"rejected\""))
            let gatedRequest = { (download: Double?, upload: Double?) in
                CycleRequest(
                    workerID: gatedDevice.workerID, processName: "gated", processVersion: SemanticVersion(1), downloadMbps: download, uploadMbps: upload)
            }
            expectStatus(try await cycle(gatedRequest(1, 5), token: gatedDevice.sessionToken), 200, nil, "too slow")
            expectStatus(try await cycle(gatedRequest(nil, nil), token: gatedDevice.sessionToken), 400, "invalid_request", "no speeds")
            expectStatus(try await cycle(gatedRequest(-1, 5), token: gatedDevice.sessionToken), 400, "invalid_request", "negative speed")
            expectStatus(try await cycle(tiny(device.workerID), token: nil), 401, "unauthorized", "no session")
            expectStatus(try await cycle(tiny(device.workerID), token: other.sessionToken), 403, "forbidden", "another worker")
            let mismatch = CycleRequest(workerID: device.workerID, processName: "gated", processVersion: SemanticVersion(1), downloadMbps: 100, uploadMbps: 100)
            expectStatus(try await cycle(mismatch, token: device.sessionToken), 403, "session_process_mismatch", "another process")
            let unknown = CycleRequest(workerID: device.workerID, processName: "nope", processVersion: SemanticVersion(1))
            expectStatus(try await cycle(unknown, token: device.sessionToken), 404, "unknown_process", "unknown process")
            expectStatus(
                try await http.send("POST", Endpoint.cycleRequest, body: Array("[]".utf8), token: device.sessionToken), 400, "malformed_json", "not an object")
            expectStatus(
                try await http.send("POST", Endpoint.cycleRequest, body: [UInt8](repeating: 0x20, count: 5000), token: device.sessionToken), 413,
                "payload_too_large", "oversized")

            // Model and plan downloads.
            let key = "?request_key=\(assignment.requestKey)"
            let modelPath = Endpoint.model(assignment.modelID)
            let whole = try await http.send("GET", modelPath + key, token: device.sessionToken)
            expectStatus(whole, 200, nil, "model")
            let etag = try #require(whole.header("ETag"))
            expectStatus(try await http.send("GET", modelPath + key, token: device.sessionToken, headers: ["Range": "bytes=0-9"]), 206, nil, "range")
            expectStatus(try await http.send("GET", modelPath + key, token: device.sessionToken, headers: ["If-None-Match": etag]), 304, nil, "not modified")
            expectStatus(
                try await http.send("GET", modelPath + key, token: device.sessionToken, headers: ["Range": "bytes=\(whole.body.count)-"]), 416,
                "range_not_satisfiable", "past the end")
            expectStatus(try await http.send("GET", modelPath, token: device.sessionToken), 400, "invalid_request", "no key")
            expectStatus(try await http.send("GET", modelPath + key), 401, "unauthorized", "no session")
            expectStatus(try await http.send("GET", modelPath + key, token: other.sessionToken), 403, "invalid_request_key", "another's key")
            expectStatus(
                try await http.send("GET", Endpoint.model(hosted.processID + ".7") + key, token: device.sessionToken), 404, "unknown_checkpoint",
                "another model")
            expectStatus(try await http.send("GET", modelPath + key + "&format=mlmodel", token: device.sessionToken), 200, nil, "model as Core ML")
            expectStatus(try await http.send("GET", modelPath + key + "&format=onnx", token: device.sessionToken), 400, "invalid_request", "unknown format")
            let planPath = Endpoint.plan(assignment.planID)
            expectStatus(try await http.send("GET", planPath + key, token: device.sessionToken), 200, nil, "plan")
            expectStatus(try await http.send("GET", planPath, token: device.sessionToken), 400, "invalid_request", "plan without key")
            expectStatus(try await http.send("GET", planPath + key), 401, "unauthorized", "plan without session")
            expectStatus(try await http.send("GET", planPath + key, token: other.sessionToken), 403, "invalid_request_key", "plan with another's key")
            expectStatus(try await http.send("GET", Endpoint.plan("p_0000000000000000") + key, token: device.sessionToken), 404, "not_found", "another plan")

            // Reports.
            func report(_ body: [UInt8], token: String? = device.sessionToken) async throws -> HTTPResult {
                try await http.send("POST", Endpoint.report, body: body, token: token, headers: ["Content-Type": MediaType.safetensors])
            }
            func envelope(_ diff: [TensorRecord] = Fixture.diff(0.1), worker: String = device.workerID, key: String = assignment.requestKey, samples: Int = 5)
                -> [UInt8]
            {
                ReportEnvelope.encode(diff: diff, metadata: ReportMetadata(workerID: worker, requestKey: key, sampleCount: samples))
            }
            expectStatus(try await report([1, 2, 3]), 400, "malformed_safetensors", "not safetensors")
            expectStatus(try await report(Safetensors.encode(Fixture.diff(0.1))), 400, "invalid_request", "no metadata")
            expectStatus(try await report(envelope(), token: nil), 401, "unauthorized", "no session")
            expectStatus(try await report(envelope(worker: other.workerID), token: device.sessionToken), 403, "forbidden", "another worker")
            expectStatus(try await report(envelope(key: "0123456789abcdef0123456789abcdef")), 403, "invalid_request_key", "unknown key")
            expectStatus(try await report([UInt8](repeating: 0, count: 70 << 10)), 413, "payload_too_large", "oversized")
            expectStatus(try await report(envelope(Array(Fixture.diff(0.1).dropLast()))), 422, "tensor_mismatch", "missing tensor")
            expectStatus(try await report(envelope(samples: 0)), 422, "invalid_sample_count", "zero samples")
            let closing = try await report(envelope())
            expectStatus(closing, 200, nil, "report")
            #expect(try closing.decode(ReportResponse.self).cycleClosed)
            expectStatus(try await report(envelope()), 409, "deadline_passed", "after the cycle closed")

            // Speed test: a session of the gated process (the only kind that runs one), one test per direction per interval.
            let gatedToken = gatedDevice.sessionToken
            expectStatus(try await http.send("GET", Endpoint.speedTest + "?bytes=0", token: gatedToken), 400, "invalid_request", "speed down zero")
            expectStatus(try await http.send("GET", Endpoint.speedTest + "?bytes=1024", token: gatedToken), 200, nil, "speed down")
            expectStatus(try await http.send("GET", Endpoint.speedTest + "?bytes=1024", token: gatedToken), 429, "rate_limited", "speed down again")
            expectStatus(try await http.send("GET", Endpoint.speedTest + "?bytes=1024"), 401, "unauthorized", "speed down without session")
            expectStatus(
                try await http.send("GET", Endpoint.speedTest + "?bytes=1024", token: device.sessionToken), 403, "forbidden", "speed down, ungated process")
            expectStatus(
                try await http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: SpeedTest.maximumBytes + 1), token: gatedToken), 413,
                "payload_too_large", "speed up too much")
            expectStatus(try await http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: 1024), token: gatedToken), 200, nil, "speed up")
            expectStatus(
                try await http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: 1024), token: gatedToken), 429, "rate_limited",
                "speed up again")
            expectStatus(
                try await http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: 1024)), 401, "unauthorized", "speed up without session")
            expectStatus(
                try await http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: 1024), token: device.sessionToken), 403, "forbidden",
                "speed up, ungated process")

            // Checkpoints.
            let checkpointPath = Endpoint.checkpoint(hosted.processID, "latest")
            let latest = try await http.send("GET", checkpointPath, token: admin)
            expectStatus(latest, 200, nil, "checkpoint")
            #expect(latest.header("Orchard-Checkpoint") == "1")
            let checkpointTag = try #require(latest.header("ETag"))
            expectStatus(
                try await http.send("GET", Endpoint.checkpoint(hosted.processID, "0"), token: admin, headers: ["Range": "bytes=-8"]), 206, nil,
                "checkpoint range")
            expectStatus(
                try await http.send("GET", checkpointPath, token: admin, headers: ["If-None-Match": checkpointTag]), 304, nil, "checkpoint not modified")
            expectStatus(
                try await http.send("GET", checkpointPath, token: admin, headers: ["Range": "bytes=a-b"]), 416, "range_not_satisfiable", "malformed range")
            expectStatus(try await http.send("GET", Endpoint.checkpoint(hosted.processID, "first"), token: admin), 400, "invalid_request", "not a number")
            expectStatus(try await http.send("GET", Endpoint.checkpoint(hosted.processID, "9"), token: admin), 404, "unknown_checkpoint", "no such checkpoint")
            expectStatus(try await http.send("GET", checkpointPath), 401, "unauthorized", "checkpoint without token")

            // A report already received: the gated process (goal 3) stays open after one report.
            let gatedAnswer = try await cycle(gatedRequest(100, 100), token: gatedDevice.sessionToken)
            guard case .accepted(let gatedAssignment) = try gatedAnswer.decode(CycleResponse.self) else {
                Issue.record("gated device not accepted: \(String(decoding: gatedAnswer.body, as: UTF8.self))")
                return
            }
            let gatedReport = envelope(worker: gatedDevice.workerID, key: gatedAssignment.requestKey)
            expectStatus(try await report(gatedReport, token: gatedDevice.sessionToken), 200, nil, "gated report")
            expectStatus(try await report(gatedReport, token: gatedDevice.sessionToken), 409, "report_already_received", "gated report again")

            // Secure aggregation: a process of three devices through its four stages, and each kind of refusal.
            var secureProcess = SecureFixture.host(goal: 3, minimum: 3)
            secureProcess.name = "secure"
            _ = try await harness.host(secureProcess)
            var secureDevices: [SecureTestDevice] = []
            for i in 0..<3 {
                let auth = try await harness.device(name: "secure")
                guard case .accepted(let secureAssignment) = try await harness.requestCycle(auth, name: "secure") else {
                    Issue.record("secure device not accepted")
                    return
                }
                secureDevices.append(SecureTestDevice(auth: auth, assignment: secureAssignment, scale: Float(i) * 0.1, samples: i + 1, seed: UInt64(i)))
            }
            for i in secureDevices.indices { _ = try await secureDevices[i].advertise(on: http) }
            let first = secureDevices[0]
            let keys = try first.secrets.publicKeys()
            let advertise = SecureAggregationPublicKeys(channelPublicKey: keys.channel, maskPublicKey: keys.mask)
            let emptyUnmask = SecureAggregationUnmaskResponse(device: 1, selfMaskShares: [], secretKeyShares: [])
            expectStatus(try await first.send(first.request(advertise: advertise, unmask: emptyUnmask), on: http), 400, "invalid_request", "two stage messages")
            expectStatus(try await http.json("POST", Endpoint.secureAggregation, first.request()), 401, "unauthorized", "secure aggregation without a session")
            var forgedWorker = first.request()
            forgedWorker.workerID = secureDevices[1].auth.workerID
            expectStatus(try await first.send(forgedWorker, on: http), 403, "forbidden", "another worker's step")
            expectStatus(try await first.send(first.request(advertise: advertise), on: http), 409, "stage_closed", "advertising after advertise_keys closed")
            let roster = try await first.send(first.request(), on: http).decode(SecureAggregationReply.self)
            #expect(roster.next == .shareKeys)
            let lonely = SecureAggregationShareKeys(device: 1, shares: [])
            expectStatus(try await first.send(first.request(shareKeys: lonely), on: http), 422, "invalid_secure_aggregation_message", "no bundles")
            let oversized = Array(repeating: UInt8(ascii: " "), count: (64 << 10) / 3 * 4 + 4097)
            expectStatus(
                try await http.send(
                    "POST", Endpoint.secureAggregation, body: oversized, token: first.auth.sessionToken, headers: ["Content-Type": MediaType.json]), 413,
                "payload_too_large", "oversized step")
            for _ in 0..<3 {
                for i in secureDevices.indices { _ = try await secureDevices[i].step(on: http) }
            }

            // Federated evaluation: a task, its result, each kind of refusal, and the task's key after it expired and after its
            // process was deleted.
            let evaluatedProcess = try await harness.host(FederatedEvaluationTests.host(evaluation: FederatedEvaluationConfig(goal: 3), name: "fedeval"))
            let evaluator = try await harness.device(name: "fedeval")
            let task = try await FederatedEvaluationTests.task(in: harness, evaluator, name: "fedeval")
            let taskKey = "?request_key=\(task.requestKey)"
            expectStatus(try await http.send("GET", Endpoint.plan(task.planID) + taskKey, token: evaluator.sessionToken), 200, nil, "evaluation plan")
            expectStatus(try await http.send("GET", Endpoint.model(task.modelID) + taskKey, token: evaluator.sessionToken), 200, nil, "evaluation model")
            func evaluationReport(samples: Int = 4, metrics: [String: Double] = ["loss": 0.5], worker: String? = nil, key: String? = nil, token: String? = nil)
                async throws -> HTTPResult
            {
                let body = EvaluationReport(workerID: worker ?? evaluator.workerID, requestKey: key ?? task.requestKey, samples: samples, metrics: metrics)
                return try await http.json("POST", Endpoint.evaluationReport, body, token: token ?? evaluator.sessionToken)
            }
            expectStatus(
                try await http.send(
                    "POST", Endpoint.evaluationReport, body: Array("{}".utf8), token: evaluator.sessionToken, headers: ["Content-Type": MediaType.json]), 400,
                "malformed_json", "not an evaluation report")
            expectStatus(try await evaluationReport(metrics: ["mae": 1]), 400, "invalid_request", "no loss")
            expectStatus(
                try await http.json("POST", Endpoint.evaluationReport, EvaluationReport(workerID: "w", requestKey: "k", samples: 1, metrics: [:])), 401,
                "unauthorized", "no session")
            expectStatus(try await evaluationReport(worker: other.workerID), 403, "forbidden", "another worker's result")
            expectStatus(try await evaluationReport(key: "e.0.1.00"), 403, "invalid_request_key", "a forged key")
            expectStatus(try await evaluationReport(samples: 2_000_000), 422, "invalid_sample_count", "too many samples")
            expectStatus(
                try await http.send(
                    "POST", Endpoint.evaluationReport, body: [UInt8](repeating: 0x20, count: 70 << 10), token: evaluator.sessionToken,
                    headers: ["Content-Type": MediaType.json]), 413, "payload_too_large", "oversized result")
            expectStatus(try await evaluationReport(), 200, nil, "evaluation result")
            expectStatus(try await evaluationReport(), 409, "evaluation_already_received", "the result again")
            // An evaluation-only request with no task left for it is turned away, not admitted to train.
            guard case .rejected(let noTask) = try await FederatedEvaluationTests.check(in: harness, evaluator, tasks: [.evaluation], name: "fedeval")
            else {
                Issue.record("an evaluation-only request was not turned away")
                return
            }
            #expect(noTask.reason == "no_evaluation_task")
            harness.clock.advance(bySeconds: 301)
            expectStatus(
                try await http.send("GET", Endpoint.plan(task.planID) + taskKey, token: evaluator.sessionToken), 409, "deadline_passed", "expired plan")
            expectStatus(
                try await http.send("GET", Endpoint.model(task.modelID) + taskKey, token: evaluator.sessionToken), 409, "deadline_passed", "expired model")
            expectStatus(try await http.send("DELETE", Endpoint.process(evaluatedProcess.processID), token: admin), 204, nil, "delete the evaluated process")
            expectStatus(
                try await http.send("GET", Endpoint.plan(task.planID) + taskKey, token: evaluator.sessionToken), 404, "unknown_process", "plan, process gone")
            expectStatus(
                try await http.send("GET", Endpoint.model(task.modelID) + taskKey, token: evaluator.sessionToken), 404, "unknown_process", "model, process gone"
            )
            expectStatus(try await evaluationReport(), 404, "unknown_process", "result, process gone")

            // Deletion.
            expectStatus(try await http.send("DELETE", Endpoint.process(signedStatus.processID)), 401, "unauthorized", "delete without token")
            expectStatus(try await http.send("DELETE", Endpoint.process(signedStatus.processID), token: admin), 204, nil, "delete")
            expectStatus(try await http.send("DELETE", Endpoint.process(signedStatus.processID), token: admin), 404, "unknown_process", "delete again")
            expectStatus(
                try await http.send("GET", Endpoint.checkpoint(signedStatus.processID, "latest"), token: admin), 404, "unknown_process",
                "checkpoint of a deleted process")
            expectStatus(try await http.send("GET", "/v1/nothing"), 404, "not_found", "no route")

            // Coverage: every documented operation was exercised, and every documented status but the listed ones.
            let exchanges = harness.log.exchanges
            var seen: [OpenAPIOperation: Set<String>] = [:]
            for exchange in exchanges {
                if let matched = Conformance.document.match(method: exchange.method, path: exchange.path) {
                    seen[matched.operation, default: []].insert(String(exchange.status))
                }
            }
            let operations = Conformance.document.operations
            #expect(operations.count == 21)
            for operation in operations {
                #expect(seen[operation] != nil, "\(operation) was never exercised")
            }
            // Not provoked here: the coordinator's own failures (500), and the report's and secure aggregation's 404
            // unknown_worker (a worker that vanished under a live session; no API removes a worker). Secure aggregation's 503
            // too_many_uploads is provoked in SecureAggregationCoordinatorTests.
            // Also provoked elsewhere, through the same document-checking client: authenticate's 403 worker_limit_reached
            // and 429 rate_limited (OpenModeLimitTests), the report's 503 too_many_uploads (UploadLimitTests); and not
            // at all, the speed test's 404 (a gated process deleted under a live session). The model's 422
            // unsupported_format (a model Core ML cannot express) is provoked in CoreMLDeviceTests. The admin operations'
            // 429 (wrong admin tokens from one address) is provoked in AbuseLimitTests for one of them; it comes from the
            // one check every admin operation goes through.
            let adminRateLimited = operations.map { "\($0)" }.filter { $0.contains("/v1/admin/") }.map { "\($0) 429" }
            let notExercised: Set<String> = Set(adminRateLimited).union([
                "GET /v1/device/models/{model_id} 422",
                "POST /v1/device/report 404", "POST /v1/device/authenticate 403", "POST /v1/device/authenticate 429",
                "POST /v1/device/report 503", "GET /v1/device/speed-test 404", "POST /v1/device/speed-test 404",
                "POST /v1/device/secure-aggregation 404", "POST /v1/device/secure-aggregation 503",
            ])
            var documented: Set<String> = []
            var missing: Set<String> = []
            for operation in operations {
                for status in Conformance.document.statuses(of: operation) where status != "500" {
                    documented.insert("\(operation) \(status)")
                    if !(seen[operation]?.contains(status) ?? false) { missing.insert("\(operation) \(status)") }
                }
            }
            #expect(notExercised.isSubset(of: documented))
            #expect(missing == notExercised, "documented but never exercised: \(missing.subtracting(notExercised).sorted())")
        }
    }
}
