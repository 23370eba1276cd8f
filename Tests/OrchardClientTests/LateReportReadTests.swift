import Foundation
import OrchardClient
import OrchardML
import OrchardProtocol
import OrchardTesting
import Synchronization
import Testing

/// A transport that sends a report only after a wait (the simulator's, waiting for its turn) is given the report's size
/// and a reader, and the report is read from the device's disk when it is sent, not held in memory meanwhile.
final class LateReadTransport: ClientTransport {
    struct Log {
        var byteCounts: [Int] = []
        var onDiskWhenRead: [Bool] = []
        var bodies: [[UInt8]] = []
    }

    let inner: ScriptedCoordinator
    let directory: URL
    let log = Mutex(Log())

    init(inner: ScriptedCoordinator, directory: URL) {
        self.inner = inner
        self.directory = directory
    }

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse { try await inner.authenticate(request) }
    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await inner.requestCycle(request, session: session)
    }
    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }
    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        try await inner.downloadModel(request, session: session, into: sink)
    }
    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        Issue.record("the job read the report before the transport asked for it")
        return try await inner.report(body, session: session)
    }

    func report(byteCount: Int, body: () throws(OrchardClientError) -> [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        let pending = FileManager.default.enumerator(atPath: directory.path)?.contains { ($0 as? String)?.hasSuffix("pending-report.safetensors") == true }
        let bytes = try body()
        log.withLock {
            $0.byteCounts.append(byteCount)
            $0.onDiskWhenRead.append(pending == true)
            $0.bodies.append(bytes)
        }
        return try await inner.report(bytes, session: session)
    }
}

@Suite struct LateReportReadTests {
    @Test func theReportIsReadFromDiskWhenTheTransportSendsIt() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-late-read-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let coordinator = try ScriptedCoordinator(clientConfig: CycleFlowTests.config)
        let transport = LateReadTransport(inner: coordinator, directory: directory)
        let configuration = DeviceConfiguration(
            storageDirectory: directory, environment: .seeded(1, clock: RecordingClock()), trainingSeed: 42, trainer: EngineLocalTrainer())
        let client = CoordinatorConnection(transport: transport, server: "scripted", configuration: configuration)
        let outcome = try await client.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset())
        guard case .reported = outcome else {
            Issue.record("expected a report, got \(outcome)")
            return
        }
        let log = transport.log.withLock { $0 }
        #expect(log.byteCounts.count == 1)
        #expect(log.onDiskWhenRead == [true], "the report is on the device's disk when the transport reads it")
        let body = try #require(log.bodies.first)
        #expect(log.byteCounts == [body.count], "the size given first is the size of what is read")
        #expect(try diffOf(body) == (try referenceDiff(clientConfig: CycleFlowTests.config, seed: 43)))
        #expect(await coordinator.reports.count == 1)
    }
}
