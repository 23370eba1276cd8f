import Foundation
#if canImport(Glibc)
import Glibc
#endif
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardTesting
import Testing

/// Runs `orchard serve` as a child process on a free port.
private struct ServerProcess {
    let server: OrchardExecutable.Server

    static func start(database: String, foldInterval: Int) async throws -> ServerProcess {
        ServerProcess(
            server: try await OrchardExecutable.Server.start(
                ["--database", database, "--fold-interval", "\(foldInterval)", "--log-level", "warning"],
                environment: ["ORCHARD_ADMIN_TOKEN": Harness.adminToken]
            ))
    }

    var http: HTTP { HTTP(base: server.url) }

    func kill9() async { await server.kill9() }
    func terminate() { server.terminate() }
}

/// A device of process "tiny" authenticated and admitted to its cycle at `http`.
private func join(on http: HTTP) async throws -> (AuthenticateResponse, CycleAssignment) {
    let device = try await http.json("POST", Endpoint.authenticate, AuthenticateRequest(processName: "tiny", processVersion: SemanticVersion(1)))
        .decode(AuthenticateResponse.self)
    let response = try await http.json(
        "POST", Endpoint.cycleRequest, CycleRequest(workerID: device.workerID, processName: "tiny", processVersion: SemanticVersion(1)),
        token: device.sessionToken
    ).decode(CycleResponse.self)
    guard case .accepted(let assignment) = response else { throw HarnessError(description: "device rejected: \(response)") }
    return (device, assignment)
}

/// A fresh directory for a coordinator's database; the caller removes it.
private func temporaryDirectory(_ prefix: String) throws -> URL {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    return directory
}

@Suite(.serialized) struct CrashRecoveryTests {
    @Test func killDashNineMidCycleLosesNothingAcknowledgedAndCountsNothingTwice() async throws {
        let directory = try temporaryDirectory("orchard-crash-")
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = directory.appendingPathComponent("coordinator.sqlite").path

        var server = try await ServerProcess.start(database: database, foldInterval: 2)
        defer { server.terminate() }
        var http = server.http
        let hosted = try await http.json("POST", Endpoint.processes, Fixture.host(goal: 5, minimum: 1, overSelection: 1), token: Harness.adminToken).decode(
            ProcessStatus.self)

        var devices: [(AuthenticateResponse, CycleAssignment)] = []
        for _ in 0..<5 { devices.append(try await join(on: http)) }
        let reports: [(scale: Float, samples: Int)] = [(0.1, 3), (-0.3, 1), (0.2, 7), (0.5, 2), (-0.4, 4)]
        func send(_ i: Int, on http: HTTP) async throws -> HTTPResult {
            let body = ReportEnvelope.encode(
                diff: Fixture.diff(reports[i].scale),
                metadata: ReportMetadata(workerID: devices[i].0.workerID, requestKey: devices[i].1.requestKey, sampleCount: reports[i].samples))
            return try await http.send("POST", Endpoint.report, body: body, token: devices[i].0.sessionToken)
        }
        // Three acknowledged reports: two folded into the stored sum (fold interval 2), one only as a diff row.
        for i in 0..<3 {
            #expect(try await send(i, on: http).status == 200)
        }
        // A fourth report races the kill: it may or may not have been committed.
        let racingBody = ReportEnvelope.encode(
            diff: Fixture.diff(reports[3].scale),
            metadata: ReportMetadata(workerID: devices[3].0.workerID, requestKey: devices[3].1.requestKey, sampleCount: reports[3].samples))
        let racingToken = devices[3].0.sessionToken
        let racing = Task { [http] in try? await http.send("POST", Endpoint.report, body: racingBody, token: racingToken) }
        await server.kill9()
        _ = await racing.value

        server = try await ServerProcess.start(database: database, foldInterval: 2)
        http = server.http
        let status = try await http.send("GET", Endpoint.process(hosted.processID), token: Harness.adminToken).decode(ProcessStatus.self)
        let reported = try #require(status.currentCycle?.reported)
        #expect(reported == 3 || reported == 4)
        #expect(status.latestCheckpoint == 0)

        // Resending an acknowledged report is refused, so it cannot count twice.
        let duplicate = try await send(0, on: http)
        #expect(duplicate.status == 409)
        #expect(duplicate.errorCode == "report_already_received")
        // The racing report is accepted now unless it was committed before the kill.
        let resent = try await send(3, on: http)
        #expect(resent.status == (reported == 4 ? 409 : 200))
        #expect(try await send(4, on: http).status == 200)

        let final = try await http.send("GET", Endpoint.process(hosted.processID), token: Harness.adminToken).decode(ProcessStatus.self)
        #expect(final.latestCheckpoint == 1)
        let checkpoint = try await http.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: Harness.adminToken)
        expectClose(try Safetensors.decode(checkpoint.body).byName.mapValues(\.values), Fixture.expectedAfterFedAvg(reports))
    }
}

@Suite(.serialized) struct BufferedCrashTests {
    /// A buffered process (buffers of 3): after the first release, a carried-over device's stale report is acknowledged
    /// and folded, another races the SIGKILL; after the restart nothing acknowledged is lost or counted twice, and the
    /// next release is the staleness-weighted fold of exactly its reports.
    @Test func killDashNineMidBufferLosesNothingAcknowledgedAndCountsNothingTwice() async throws {
        let directory = try temporaryDirectory("orchard-buffered-crash-")
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = directory.appendingPathComponent("coordinator.sqlite").path
        var server = try await ServerProcess.start(database: database, foldInterval: 1)
        defer { server.terminate() }
        var http = server.http
        let hosted = try await http.json("POST", Endpoint.processes, BufferedCoordinatorTests.host(size: 3, concurrency: 6), token: Harness.adminToken)
            .decode(ProcessStatus.self)
        var devices: [(AuthenticateResponse, CycleAssignment)] = []
        for _ in 0..<5 { devices.append(try await join(on: http)) }
        let reports: [(scale: Float, samples: Int)] = [(0.1, 3), (-0.3, 1), (0.2, 7), (0.5, 2), (-0.4, 4), (0.3, 5)]
        func body(_ i: Int) -> [UInt8] {
            ReportEnvelope.encode(
                diff: Fixture.diff(reports[i].scale),
                metadata: ReportMetadata(
                    workerID: devices[i].0.workerID, requestKey: devices[i].1.requestKey, sampleCount: reports[i].samples, checkpoint: devices[i].1.checkpoint))
        }
        for i in 0..<3 { #expect(try await http.send("POST", Endpoint.report, body: body(i), token: devices[i].0.sessionToken).status == 200) }
        let first = BufferedCoordinatorTests.expectedRelease(from: Fixture.host().weightsByName, [(0.1, 3, 0), (-0.3, 1, 0), (0.2, 7, 0)])
        // Device 3 (carried over, staleness 1) is acknowledged; device 4's report races the kill.
        #expect(try await http.send("POST", Endpoint.report, body: body(3), token: devices[3].0.sessionToken).status == 200)
        let racingBody = body(4), racingToken = devices[4].0.sessionToken
        let racing = Task { [http] in try? await http.send("POST", Endpoint.report, body: racingBody, token: racingToken) }
        await server.kill9()
        _ = await racing.value

        server = try await ServerProcess.start(database: database, foldInterval: 1)
        http = server.http
        let status = try await http.send("GET", Endpoint.process(hosted.processID), token: Harness.adminToken).decode(ProcessStatus.self)
        #expect(status.latestCheckpoint == 1)
        let fill = try #require(status.currentCycle?.buffered?.bufferFill)
        #expect(fill == 1 || fill == 2)
        #expect(try await http.send("POST", Endpoint.report, body: body(3), token: devices[3].0.sessionToken).errorCode == "report_already_received")
        let resent = try await http.send("POST", Endpoint.report, body: body(4), token: devices[4].0.sessionToken)
        #expect(resent.status == (fill == 2 ? 409 : 200))
        // A device admitted after the restart trains from checkpoint 1 and fills the buffer.
        devices.append(try await join(on: http))
        #expect(devices[5].1.checkpoint == 1)
        #expect(try await http.send("POST", Endpoint.report, body: body(5), token: devices[5].0.sessionToken).status == 200)
        let final = try await http.send("GET", Endpoint.process(hosted.processID), token: Harness.adminToken).decode(ProcessStatus.self)
        #expect(final.latestCheckpoint == 2)
        let checkpoint = try await http.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: Harness.adminToken)
        expectClose(
            try Safetensors.decode(checkpoint.body).byName.mapValues(\.values),
            BufferedCoordinatorTests.expectedRelease(from: first, [(0.5, 2, 1), (-0.4, 4, 1), (0.3, 5, 0)]))
    }
}

@Suite(.serialized) struct SecureAggregationCrashTests {
    /// Four devices of a secure-aggregation process; the coordinator is SIGKILLed after two masked inputs were
    /// acknowledged (and a third races the kill), then restarted on the same database.
    @Test func killDashNineBetweenStagesLosesNothingAcknowledgedAndCountsNothingTwice() async throws {
        let directory = try temporaryDirectory("orchard-secure-crash-")
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = directory.appendingPathComponent("coordinator.sqlite").path

        var server = try await ServerProcess.start(database: database, foldInterval: 2)
        defer { server.terminate() }
        var http = server.http
        let hosted = try await http.json("POST", Endpoint.processes, SecureFixture.host(goal: 4, minimum: 3), token: Harness.adminToken).decode(
            ProcessStatus.self)
        let inputs: [(scale: Float, samples: Int)] = [(0.1, 3), (-0.3, 1), (0.2, 7), (0.5, 2)]
        var devices: [SecureTestDevice] = []
        for (i, input) in inputs.enumerated() {
            let auth = try await http.json("POST", Endpoint.authenticate, AuthenticateRequest(processName: "tiny", processVersion: SemanticVersion(1))).decode(
                AuthenticateResponse.self)
            let response = try await http.json(
                "POST", Endpoint.cycleRequest, CycleRequest(workerID: auth.workerID, processName: "tiny", processVersion: SemanticVersion(1)),
                token: auth.sessionToken
            ).decode(CycleResponse.self)
            guard case .accepted(let assignment) = response else { throw HarnessError(description: "device rejected: \(response)") }
            devices.append(SecureTestDevice(auth: auth, assignment: assignment, scale: input.scale, samples: input.samples, seed: UInt64(7 + i)))
        }
        for i in devices.indices { _ = try await devices[i].advertise(on: http) }
        for i in devices.indices { _ = try await devices[i].step(on: http) }
        var masked: [SecureAggregationRequest] = []
        for i in devices.indices {
            let polled = try await devices[i].send(devices[i].request(), on: http).decode(SecureAggregationReply.self)
            masked.append(try #require(try devices[i].answer(polled)))
        }
        for i in 0..<2 { #expect(try await devices[i].send(masked[i], on: http).status == 200) }
        let racing = Task { [http, device = devices[2], message = masked[2]] in try? await device.send(message, on: http) }
        await server.kill9()
        _ = await racing.value

        server = try await ServerProcess.start(database: database, foldInterval: 2)
        http = server.http
        let status = try await http.send("GET", Endpoint.process(hosted.processID), token: Harness.adminToken).decode(ProcessStatus.self)
        let secure = try #require(status.currentCycle?.secureAggregation)
        #expect(secure.stage == .maskedInput)
        #expect(secure.masked == 2 || secure.masked == 3)
        // An acknowledged masked input sent again is refused: it is in the sum once.
        let again = try await devices[0].send(masked[0], on: http)
        #expect(again.status == 409)
        #expect(again.errorCode == "duplicate_message")
        // The racing one is accepted now unless it was committed before the kill.
        #expect(try await devices[2].send(masked[2], on: http).status == (secure.masked == 3 ? 409 : 200))
        #expect(try await devices[3].send(masked[3], on: http).status == 200)
        for i in devices.indices { _ = try await devices[i].step(on: http) }

        let final = try await http.send("GET", Endpoint.process(hosted.processID), token: Harness.adminToken).decode(ProcessStatus.self)
        #expect(final.latestCheckpoint == 1)
        let checkpoint = try await http.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: Harness.adminToken)
        expectClose(try Safetensors.decode(checkpoint.body).byName.mapValues(\.values), Fixture.expectedAfterFedAvg(inputs), tolerance: SecureFixture.step)
    }
}
