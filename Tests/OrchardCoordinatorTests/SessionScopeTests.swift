import OrchardSupport
import Foundation
import JWTKit
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

private struct ScopedDeviceToken: JWTPayload {
    var sub: SubjectClaim
    var exp: ExpirationClaim
    var iss: IssuerClaim?
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Sessions are bound to the process they were issued for; device identities are scoped per process and issuer.
@Suite(.serialized) struct SessionScopeTests {
    static let secretA = "secret-of-process-alpha-32-bytes-long!"
    static let secretB = "secret-of-process-beta-32-bytes-long!!"

    private func keys(_ secret: String) async -> JWTKeyCollection {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
        return keys
    }

    private func authenticate(_ harness: Harness, process: String, secret: String, issuer: String?, subject: String) async throws -> HTTPResult {
        let token = try await keys(secret).sign(
            ScopedDeviceToken(
                sub: SubjectClaim(value: subject), exp: ExpirationClaim(value: harness.clock.date.addingTimeInterval(3600)),
                iss: issuer.map { IssuerClaim(value: $0) }
            ))
        return try await harness.http.json(
            "POST", Endpoint.authenticate, AuthenticateRequest(authToken: token, processName: process, processVersion: SemanticVersion(1)))
    }

    private func hosted(_ name: String, _ authentication: AuthenticationConfig? = nil, goal: Int = 3) -> HostProcessRequest {
        var request = Fixture.host(name: name, goal: goal)
        if let authentication { request.serverConfig.authentication = authentication }
        return request
    }

    private func reportBody(worker: String, key: String) -> [UInt8] {
        ReportEnvelope.encode(diff: Fixture.diff(0.1), metadata: ReportMetadata(workerID: worker, requestKey: key, sampleCount: 2, metrics: [:]))
    }

    private func sendReport(_ harness: Harness, worker: String, key: String, token: String) async throws -> HTTPResult {
        try await harness.http.send(
            "POST", Endpoint.report, body: reportBody(worker: worker, key: key), token: token, headers: ["Content-Type": MediaType.safetensors])
    }

    private func expectRefused(_ result: HTTPResult, _ code: String, containing text: String, sourceLocation: SourceLocation = #_sourceLocation) {
        let body = String(decoding: result.body, as: UTF8.self)
        #expect(result.status == 403, "\(body)", sourceLocation: sourceLocation)
        #expect(result.errorCode == code, "\(body)", sourceLocation: sourceLocation)
        #expect(body.contains(text), "\(body)", sourceLocation: sourceLocation)
    }

    @Test func aSessionOfOneProcessIsRefusedForEveryRequestOfAnother() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host(hosted("open-a"))
            _ = try await harness.host(hosted("secured-b", .hs256(secret: Self.secretB, issuer: "issuer-b")))
            let fromA = try await harness.device(name: "open-a")
            let fromB = try await authenticate(harness, process: "secured-b", secret: Self.secretB, issuer: "issuer-b", subject: "phone-1").decode(
                AuthenticateResponse.self)
            guard case .accepted(let assignmentB) = try await harness.requestCycle(fromB, name: "secured-b") else {
                Issue.record("B's device was not admitted")
                return
            }

            // Cycle request for B with A's session (and A's own worker id).
            let cycle = try await harness.http.json(
                "POST", Endpoint.cycleRequest, CycleRequest(workerID: fromA.workerID, processName: "secured-b", processVersion: SemanticVersion(1)),
                token: fromA.sessionToken
            )
            expectRefused(cycle, "session_process_mismatch", containing: "issued for process 'open-a' version 1.0.0, not for process 'secured-b'")
            // Plan and model downloads of B's assignment with A's session.
            let query = "?\(Endpoint.requestKeyQuery)=\(assignmentB.requestKey)"
            expectRefused(
                try await harness.http.send("GET", Endpoint.plan(assignmentB.planID) + query, token: fromA.sessionToken), "session_process_mismatch",
                containing: "'secured-b'")
            expectRefused(
                try await harness.http.send("GET", Endpoint.model(assignmentB.modelID) + query, token: fromA.sessionToken), "session_process_mismatch",
                containing: "'secured-b'")
            // A report for B's request key with A's session, naming A's worker or B's.
            expectRefused(
                try await sendReport(harness, worker: fromA.workerID, key: assignmentB.requestKey, token: fromA.sessionToken), "session_process_mismatch",
                containing: "'secured-b'")
            expectRefused(
                try await sendReport(harness, worker: fromB.workerID, key: assignmentB.requestKey, token: fromA.sessionToken), "forbidden",
                containing: "another worker")
            // The other direction: B's session for the open process A.
            let reverse = try await harness.http.json(
                "POST", Endpoint.cycleRequest, CycleRequest(workerID: fromB.workerID, processName: "open-a", processVersion: SemanticVersion(1)),
                token: fromB.sessionToken
            )
            expectRefused(reverse, "session_process_mismatch", containing: "issued for process 'secured-b'")

            // None of that disturbed B's own use of its session.
            #expect(try await harness.http.send("GET", Endpoint.plan(assignmentB.planID) + query, token: fromB.sessionToken).status == 200)
            #expect(try await harness.http.send("GET", Endpoint.model(assignmentB.modelID) + query, token: fromB.sessionToken).status == 200)
            #expect(try await sendReport(harness, worker: fromB.workerID, key: assignmentB.requestKey, token: fromB.sessionToken).status == 200)
        }
    }

    @Test func aRequestKeyOfOneWorkerIsRefusedForAnother() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host(hosted("tiny"))
            let first = try await harness.device()
            let second = try await harness.device()
            let one = try await harness.join(first)
            _ = try await harness.join(second)
            let query = "?\(Endpoint.requestKeyQuery)=\(one.requestKey)"

            expectRefused(
                try await harness.http.send("GET", Endpoint.plan(one.planID) + query, token: second.sessionToken), "invalid_request_key",
                containing: "another worker")
            expectRefused(
                try await harness.http.send("GET", Endpoint.model(one.modelID) + query, token: second.sessionToken), "invalid_request_key",
                containing: "another worker")
            expectRefused(
                try await sendReport(harness, worker: second.workerID, key: one.requestKey, token: second.sessionToken), "invalid_request_key",
                containing: "another worker")
            // Naming the first worker with the second's session is refused before the key is looked at.
            expectRefused(
                try await sendReport(harness, worker: first.workerID, key: one.requestKey, token: second.sessionToken), "forbidden",
                containing: "another worker")
            let crossed = try await harness.http.json(
                "POST", Endpoint.cycleRequest, CycleRequest(workerID: first.workerID, processName: "tiny", processVersion: SemanticVersion(1)),
                token: second.sessionToken
            )
            expectRefused(crossed, "forbidden", containing: "another worker")

            // The first worker's key still works for the first worker.
            #expect(try await harness.http.send("GET", Endpoint.plan(one.planID) + query, token: first.sessionToken).status == 200)
            #expect(try await harness.report(first, one, diff: Fixture.diff(0.1), samples: 2).status == 200)
        }
    }

    @Test func theSameSubjectFromTwoIssuersIsTwoWorkers() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host(hosted("alpha", .hs256(secret: Self.secretA, issuer: "issuer-a")))
            _ = try await harness.host(hosted("beta", .hs256(secret: Self.secretB, issuer: "issuer-b")))
            // One process that names no issuer: the token's own `iss` scopes the subject.
            _ = try await harness.host(hosted("gamma", .hs256(secret: Self.secretA)))

            let alpha = try await authenticate(harness, process: "alpha", secret: Self.secretA, issuer: "issuer-a", subject: "device-42").decode(
                AuthenticateResponse.self)
            let alphaAgain = try await authenticate(harness, process: "alpha", secret: Self.secretA, issuer: "issuer-a", subject: "device-42").decode(
                AuthenticateResponse.self)
            let beta = try await authenticate(harness, process: "beta", secret: Self.secretB, issuer: "issuer-b", subject: "device-42").decode(
                AuthenticateResponse.self)
            let betaAgain = try await authenticate(harness, process: "beta", secret: Self.secretB, issuer: "issuer-b", subject: "device-42").decode(
                AuthenticateResponse.self)
            #expect(alpha.workerID == alphaAgain.workerID)
            #expect(beta.workerID == betaAgain.workerID)
            #expect(alpha.workerID != beta.workerID)

            let gammaX = try await authenticate(harness, process: "gamma", secret: Self.secretA, issuer: "x", subject: "device-42").decode(
                AuthenticateResponse.self)
            let gammaY = try await authenticate(harness, process: "gamma", secret: Self.secretA, issuer: "y", subject: "device-42").decode(
                AuthenticateResponse.self)
            let gammaXAgain = try await authenticate(harness, process: "gamma", secret: Self.secretA, issuer: "x", subject: "device-42").decode(
                AuthenticateResponse.self)
            #expect(gammaX.workerID != gammaY.workerID)
            #expect(gammaX.workerID == gammaXAgain.workerID)
            #expect(Set([alpha.workerID, beta.workerID, gammaX.workerID, gammaY.workerID]).count == 4)

            // A token of alpha's issuer is not accepted by beta (its secret and issuer differ).
            #expect(try await authenticate(harness, process: "beta", secret: Self.secretA, issuer: "issuer-a", subject: "device-42").status == 401)

            // The scoping survives a restart: the same identity maps to the same worker, and the sessions still hold.
            try await harness.restart()
            let alphaAfter = try await authenticate(harness, process: "alpha", secret: Self.secretA, issuer: "issuer-a", subject: "device-42").decode(
                AuthenticateResponse.self)
            #expect(alphaAfter.workerID == alpha.workerID)
            let refused = try await harness.http.json(
                "POST", Endpoint.cycleRequest, CycleRequest(workerID: alpha.workerID, processName: "beta", processVersion: SemanticVersion(1)),
                token: alpha.sessionToken
            )
            expectRefused(refused, "session_process_mismatch", containing: "'alpha'")
            #expect(try await harness.requestCycle(alpha, name: "alpha").isAccepted)
        }
    }

    @Test func theOpenAPIDocumentNamesTheNewCodeAndTheSessionBinding() throws {
        let document = try #require(try JSONSerialization.jsonObject(with: Data(OpenAPI.document)) as? [String: Any])
        let components = try #require(document["components"] as? [String: Any])
        let schemas = try #require(components["schemas"] as? [String: Any])
        let errorBody = try #require(schemas["ErrorBody"] as? [String: Any])
        let error = try #require((errorBody["properties"] as? [String: Any])?["error"] as? [String: Any])
        let code = try #require((error["properties"] as? [String: Any])?["code"] as? [String: Any])
        #expect(code["$ref"] as? String == "#/components/schemas/ErrorCode")
        let codes = try #require((schemas["ErrorCode"] as? [String: Any])?["enum"] as? [String])
        #expect(codes.contains(WireErrorCode.sessionProcessMismatch.rawValue))
        #expect(CoordinatorError.status(of: .sessionProcessMismatch) == 403)
        let session = try #require(((components["securitySchemes"] as? [String: Any])?["session"] as? [String: Any])?["description"] as? String)
        #expect(session.contains("session_process_mismatch"))
    }
}

private extension CycleResponse {
    var isAccepted: Bool { if case .accepted = self { true } else { false } }
}
