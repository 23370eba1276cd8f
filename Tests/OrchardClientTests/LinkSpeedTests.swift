import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardInProcess
import OrchardProtocol
import OrchardSupport
import Synchronization
import Testing

/// A link of known speed: each speed-test transfer really moves its bytes through the inner transport, then
/// takes `download` or `upload` on the test clock the client times it with.
struct TimedLinkTransport: ClientTransport {
    let inner: any ClientTransport
    let clock: ManualClock
    let download: Duration
    let upload: Duration

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse { try await inner.authenticate(request) }
    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await inner.requestCycle(request, session: session)
    }
    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> OrchardProtocol.TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }
    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        try await inner.downloadModel(request, session: session, into: sink)
    }
    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse { try await inner.report(body, session: session) }

    func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        let moved = try await inner.speedTest(direction, bytes: bytes, session: session)
        clock.advance(by: direction == .download ? download : upload)
        return moved
    }
}

/// A transport that forwards only the five cycle calls, as a wrapper written before the speed test existed.
struct ForwardingOnlyTransport: ClientTransport {
    let inner: any ClientTransport

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse { try await inner.authenticate(request) }
    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await inner.requestCycle(request, session: session)
    }
    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> OrchardProtocol.TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }
    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        try await inner.downloadModel(request, session: session, into: sink)
    }
    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse { try await inner.report(body, session: session) }
}

@Suite("Link speed gate, end to end on loopback HTTP", .serialized)
struct LinkSpeedTests {
    /// 1 Mbit down and 0.5 Mbit up per measurement.
    static let downloadBytes = 125_000
    static let uploadBytes = 62_500

    /// A process that admits devices with at least 8 Mbit/s down and 2 Mbit/s up, measured with the sizes above.
    static func gatedProcess() throws -> HostProcessRequest {
        var request = try Fixture.host(clientConfig: ClientIntegrationTests.config)
        request.serverConfig.minimumDownloadMbps = 8
        request.serverConfig.minimumUploadMbps = 2
        request.serverConfig.speedTestDownloadBytes = downloadBytes
        request.serverConfig.speedTestUploadBytes = uploadBytes
        return request
    }

    /// A device over HTTP whose transfers take the given times on its own test clock; its own speed-test sizes
    /// differ from the process's, which the coordinator announces and the client uses.
    static func device(_ harness: ClientHarness, _ name: String, download: Duration, upload: Duration) throws -> (FederatedJob, RecordingTransport) {
        let clock = ManualClock()
        let transport = RecordingTransport(TimedLinkTransport(inner: try HTTPTransport(url: harness.url), clock: clock, download: download, upload: upload))
        var configuration = harness.configuration(device: name)
        configuration.linkSpeedTest = LinkSpeedTest(downloadBytes: 1000, uploadBytes: 1000, clock: clock)
        let client = CoordinatorConnection(transport: transport, server: harness.url, configuration: configuration)
        return (try client.newJob(processName: "regressor", version: "1.0"), transport)
    }

    @Test("a gated process admits a device whose measured link passes: the client measures, sends the figures, and reports")
    func fastDeviceIsAdmitted() async throws {
        try await withHarness { harness in
            let process = try await harness.host(Self.gatedProcess())
            // 1 Mbit in 0.1 s = 10 Mbit/s down; 0.5 Mbit in 0.1 s = 5 Mbit/s up.
            let (job, transport) = try Self.device(harness, "fast", download: .milliseconds(100), upload: .milliseconds(100))
            let events = collectEvents(job)
            let outcome = try await job.train(on: Fixture.dataset())
            guard case .reported(let receipt) = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(receipt.reportsReceived == 1)
            #expect(try await harness.coordinator.status(processID: process.processID).currentCycle?.reported == 1)
            let log = transport.log.withLock { $0 }
            #expect(log.speedTests.map(\.direction) == [.download, .upload])
            #expect(log.speedTests.map(\.bytes) == [Self.downloadBytes, Self.uploadBytes])
            let request = try #require(log.cycleRequests.first)
            #expect(abs((request.downloadMbps ?? 0) - 10) < 1e-9)
            #expect(abs((request.uploadMbps ?? 0) - 5) < 1e-9)
            let phases = await events.value.compactMap { if case .phase(let p) = $0 { p } else { nil } }
            #expect(phases.prefix(3) == [.authenticating, .measuringLinkSpeed, .requestingCycle])
        }
    }

    @Test("a gated process turns away a device below the gate with the coordinator's reason, download or upload")
    func slowDevicesAreRefused() async throws {
        try await withHarness { harness in
            let process = try await harness.host(Self.gatedProcess())
            // 1 Mbit in 0.5 s = 2 Mbit/s down (gate 8).
            let (slowDown, _) = try Self.device(harness, "slow-down", download: .milliseconds(500), upload: .milliseconds(100))
            let refusedDown = try await slowDown.train(on: Fixture.dataset())
            guard case .rejected(let retryAfter, let reason) = refusedDown else {
                Issue.record("expected a rejection, got \(refusedDown)")
                return
            }
            #expect(reason == "download_too_slow")
            #expect(retryAfter > 0)
            // 0.5 Mbit in 0.5 s = 1 Mbit/s up (gate 2), 10 Mbit/s down.
            let (slowUp, transport) = try Self.device(harness, "slow-up", download: .milliseconds(100), upload: .milliseconds(500))
            let refusedUp = try await slowUp.train(on: Fixture.dataset())
            #expect(refusedUp.rejectionReason == "upload_too_slow")
            let sent = try #require(transport.log.withLock { $0.cycleRequests.first })
            #expect(abs((sent.uploadMbps ?? 0) - 1) < 1e-9)
            let status = try await harness.coordinator.status(processID: process.processID)
            #expect(status.currentCycle?.assigned == 0)
        }
    }

    @Test("a transport that cannot run the speed test fails the cycle naming itself; an ungated process never measures")
    func transportWithoutSpeedTest() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Self.gatedProcess())
            let wrapped = ForwardingOnlyTransport(inner: try HTTPTransport(url: harness.url))
            let client = CoordinatorConnection(transport: wrapped, server: harness.url, configuration: harness.configuration(device: "old"))
            let error = await #expect(throws: OrchardClientError.self) {
                try await client.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset())
            }
            #expect(error?.code == .invalidConfiguration)
            #expect(error?.message.contains("ForwardingOnlyTransport") == true)

            _ = try await harness.host(Fixture.host(name: "open", clientConfig: ClientIntegrationTests.config))
            let (openClient, transport) = try harness.httpClient(device: "open")
            let outcome = try await openClient.newJob(processName: "open", version: "1.0").train(on: Fixture.dataset())
            #expect(outcome.rejectionReason == nil)
            #expect(transport.log.withLock { $0.speedTests.isEmpty })
        }
    }

    @Test("bad speed-test sizes are refused before anything is sent, and by the coordinator in process as over HTTP")
    func badSizes() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Self.gatedProcess())
            let http = try HTTPTransport(url: harness.url)
            let device = try await http.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1)))
            #expect(device.speedTestDownloadBytes == Self.downloadBytes && device.speedTestUploadBytes == Self.uploadBytes)
            for bytes in [0, -1, SpeedTest.maximumBytes + 1] {
                let test = LinkSpeedTest(downloadBytes: bytes, uploadBytes: 10)
                let error = await #expect(throws: OrchardClientError.self) { try await test.measure(over: http, session: device.sessionToken) }
                #expect(error?.code == .invalidConfiguration)
                let server = await #expect(throws: OrchardClientError.self) { try await http.speedTest(.download, bytes: bytes, session: device.sessionToken) }
                #expect(server?.httpStatus == 400)
                #expect(server?.serverCode == .invalidRequest)
            }
            // More than the process asks for is refused each way; the sizes it asks for pass once per interval.
            let tooMuch = await #expect(throws: OrchardClientError.self) {
                try await http.speedTest(.upload, bytes: Self.uploadBytes + 1, session: device.sessionToken)
            }
            #expect(tooMuch?.httpStatus == 413 && tooMuch?.serverCode == .payloadTooLarge)
            #expect(try await http.speedTest(.upload, bytes: Self.uploadBytes, session: device.sessionToken) == Self.uploadBytes)
            #expect(try await http.speedTest(.download, bytes: Self.downloadBytes, session: device.sessionToken) == Self.downloadBytes)
            let again = await #expect(throws: OrchardClientError.self) { try await http.speedTest(.download, bytes: 1, session: device.sessionToken) }
            #expect(again?.httpStatus == 429 && again?.serverCode == .rateLimited)
            #expect(again?.retryAfter == 30)
            #expect(again?.isTransient == true)
            // Without a valid session there is no speed test.
            let forged = await #expect(throws: OrchardClientError.self) { try await http.speedTest(.download, bytes: 1, session: "forged") }
            #expect(forged?.code == .authenticationFailed && forged?.httpStatus == 401)
        }
        try await withInProcessCoordinator { coordinator, _, _ in
            _ = try await coordinator.host(Self.gatedProcess())
            let memory = InProcessTransport(coordinator: coordinator)
            let device = try await memory.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1)))
            let error = await #expect(throws: OrchardClientError.self) { try await memory.speedTest(.upload, bytes: 0, session: device.sessionToken) }
            #expect(error?.httpStatus == 400)
            #expect(error?.serverCode == .invalidRequest)
            let moved = try await memory.speedTest(.download, bytes: 1000, session: device.sessionToken)
            #expect(moved == 1000)
            let again = await #expect(throws: OrchardClientError.self) { try await memory.speedTest(.download, bytes: 1000, session: device.sessionToken) }
            #expect(again?.serverCode == .rateLimited && again?.retryAfter == 30)
        }
    }

    @Test("a rate-limited speed test is retried after the coordinator's Retry-After, then the cycle goes on")
    func rateLimitedSpeedTestWaitsRetryAfter() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Self.gatedProcess())
            let (job, transport) = try Self.device(harness, "eager", download: .milliseconds(100), upload: .milliseconds(100))
            // The first cycle measures and is admitted; the second, at the same coordinator time, finds its last speed
            // test too recent: 429 with Retry-After 30, which the client waits (its clock moves the coordinator's)
            // before measuring again, and then it asks for a cycle (where it has already reported).
            guard case .reported = try await job.train(on: Fixture.dataset()) else {
                Issue.record("the first cycle was not reported")
                return
            }
            let second = try await job.train(on: Fixture.dataset())
            #expect(harness.sleeps.withLock { $0 } == [.seconds(30)])
            #expect(transport.log.withLock { $0.speedTests.map(\.direction) } == [.download, .upload, .download, .download, .upload])
            #expect(second.rejectionReason == "already_reported")
        }
    }
}

extension CycleOutcome {
    /// The coordinator's reason when the cycle request was turned away.
    var rejectionReason: String? {
        if case .rejected(_, let reason) = self { return reason }
        return nil
    }
}
