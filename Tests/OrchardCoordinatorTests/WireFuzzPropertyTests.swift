import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// Arbitrary and mutated bodies for every JSON endpoint, through the real coordinator on loopback HTTP: every
/// answer is a 2xx or a 4xx with an error code (never a 5xx; ``HTTP`` also checks each exchange against
/// `openapi.json`), and the hosted process's model and running state are unchanged afterwards. The generators do not
/// shrink, and the coordinator keeps state between inputs, so shrinking (which re-runs inputs with issues suppressed)
/// is off: every issue is reported as it happens.
@Suite(.serialized, .shrinking(false)) struct WireFuzzPropertyTests {
    static func arbitraryOrMutated(_ valid: JSONValue) -> Generator<[UInt8], Shrink.None<[UInt8]>> {
        fuzzed { rng in
            switch Int.random(in: 0...5, using: &rng) {
            case 0: return Fuzz.bytes(maximum: 512, using: &rng)
            case 1: return Fuzz.json(Fuzz.value(depth: 4, using: &rng))
            default: return Fuzz.json(Fuzz.mutate(valid, edits: 3, using: &rng))
            }
        }
    }

    /// The process's observable state: its status (without the clock-derived fields) and its checkpoint's bytes.
    private func snapshot(_ harness: Harness, _ processID: String) async throws -> [String] {
        let status = try await harness.http.send("GET", Endpoint.process(processID), token: Harness.adminToken)
        let checkpoint = try await harness.http.send("GET", Endpoint.checkpoint(processID, "latest"), token: Harness.adminToken)
        let state = try status.decode(ProcessStatus.self)
        return [
            "\(state.latestCheckpoint) \(state.checkpoints) \(state.cyclesCompleted) \(state.cyclesAbandoned) \(state.state)",
            "\(state.currentCycle.map { "\($0.number) \($0.assigned) \($0.reported)" } ?? "-")",
            Data(checkpoint.body).base64EncodedString(),
        ]
    }

    @Test func jsonEndpointsAnswerEveryBodyWith2xxOr4xxAndLeaveTheModelAlone() async throws {
        let harness = try await Harness.start(
            configuration: CoordinatorConfiguration(adminToken: Harness.adminToken, maximumAdminBodyBytes: 1 << 20, maximumMessageBytes: 16 << 10))
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 2, minimum: 2))
            let device = try await harness.device()
            _ = try await harness.join(device)
            let before = try await snapshot(harness, hosted.processID)

            let authenticate = try JSONValue.parse(WireCoding.encoder().encode(AuthenticateRequest(processName: "tiny", processVersion: SemanticVersion(1))))
            let cycle = try JSONValue.parse(
                WireCoding.encoder().encode(CycleRequest(workerID: device.workerID, processName: "tiny", processVersion: SemanticVersion(1))))
            var host = try JSONValue.parse(WireCoding.encoder().encode(Fixture.host(name: "fuzzed")))
            if case .object(var members) = host {
                // The fuzzed hosts must not take the fixture's name and version.
                members["version"] = .string("9.9")
                host = .object(members)
            }
            var statuses: [String: Int] = [:]
            let targets: [(String, JSONValue, String?)] = [
                (Endpoint.authenticate, authenticate, nil), (Endpoint.cycleRequest, cycle, device.sessionToken), (Endpoint.processes, host, Harness.adminToken),
            ]
            for (path, valid, token) in targets {
                await propertyCheck(count: 150, input: Self.arbitraryOrMutated(valid)) { body in
                    let result = try await harness.http.send("POST", path, body: body, token: token, headers: ["Content-Type": MediaType.json])
                    statuses["\(path) \(result.status) \(result.errorCode ?? "")", default: 0] += 1
                    #expect(
                        (200..<300).contains(result.status) || ((400..<500).contains(result.status) && result.errorCode != nil),
                        "\(path) \(result.status): \(String(decoding: result.body, as: UTF8.self)) for \(String(decoding: body, as: UTF8.self))")
                }
            }
            #expect(try await snapshot(harness, hosted.processID) == before, "\(statuses)")
            // Both outcomes were reached on every endpoint: the mutations are not all refused at the parser.
            for (path, _, _) in targets {
                #expect(statuses.keys.contains { $0.hasPrefix("\(path) 2") }, "\(path): \(statuses)")
                #expect(statuses.keys.contains { $0.hasPrefix("\(path) 4") }, "\(path): \(statuses)")
            }
        }
    }

    @Test func concurrentFirstAuthenticationsOfOneIdentityGetOneWorker() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Fixture.host()
            request.serverConfig.authentication = .hs256(secret: OpenAPIConformanceTests.deviceSecret)
            _ = try await harness.host(request)
            for round in 0..<3 {
                // Over HTTP and straight into the actor at once: both race on registering the same identity.
                let subject = "phone-\(round)"
                let jwt = try await OpenAPIConformanceTests.deviceToken(subject: subject, expires: harness.clock.date.addingTimeInterval(3600))
                let message = AuthenticateRequest(authToken: jwt, processName: "tiny", processVersion: SemanticVersion(1))
                let workers = try await withThrowingTaskGroup(of: String.self) { group in
                    for index in 0..<16 {
                        if index % 2 == 0 {
                            group.addTask {
                                let result = try await harness.http.json("POST", Endpoint.authenticate, message)
                                #expect(result.status == 200, "\(String(decoding: result.body, as: UTF8.self))")
                                return try result.decode(AuthenticateResponse.self).workerID
                            }
                        } else {
                            group.addTask { try await harness.coordinator.authenticate(message).workerID }
                        }
                    }
                    var ids: [String] = []
                    for try await id in group { ids.append(id) }
                    return ids
                }
                #expect(workers.count == 16)
                #expect(Set(workers).count == 1, "\(subject): \(Set(workers))")
            }
        }
    }
}
