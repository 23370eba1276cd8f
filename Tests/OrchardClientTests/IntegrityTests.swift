import Foundation
@testable import OrchardClient
import OrchardFormats
import OrchardProtocol
import Synchronization
import Testing

/// A transport that announces a wrong SHA-256 for every model download, as a corrupting proxy would.
struct WrongDigestTransport: ClientTransport {
    let inner: any ClientTransport

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse { try await inner.authenticate(request) }
    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await inner.requestCycle(request, session: session)
    }
    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }
    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse { try await inner.report(body, session: session) }

    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        try await inner.downloadModel(request, session: session, into: Tampering(inner: sink))
    }

    struct Tampering: DownloadSink {
        let inner: any DownloadSink
        func begin(_ head: DownloadHead) throws(OrchardClientError) {
            var wrong = head
            wrong.sha256 = head.sha256.map { digest in digest.map { $0 ^ 0x5A } }
            try inner.begin(wrong)
        }
        func append(_ bytes: [UInt8]) throws(OrchardClientError) { try inner.append(bytes) }
    }
}

@Suite("Model integrity: the coordinator's SHA-256 over loopback HTTP", .serialized)
struct IntegrityTests {
    static let config = ClientIntegrationTests.config

    @Test("the coordinator sends Repr-Digest; a partial download corrupted on disk is caught and downloaded again from byte zero")
    func corruptedPartialFile() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host(clientConfig: Self.config))
            let device = "corrupt"
            let (client, transport) = try harness.httpClient(device: device, configuration: harness.configuration(device: device, retry: .none))
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let total = try Fixture.initialWeights().count
            let cut = total - 16
            transport.downloadFaults.withLock { $0 = [.cutDownload(after: cut)] }
            await #expect(throws: OrchardClientError.self) { try await job.train(on: Fixture.dataset()) }

            // Flip one bit inside the weights that arrived: the file keeps its structure, only the digest can tell.
            let partial = job.directory.appendingPathComponent("model.partial")
            var bytes = [UInt8](try Data(contentsOf: partial))
            #expect(bytes.count == cut)
            bytes[cut - 8] ^= 0x01
            try Data(bytes).write(to: partial)

            let outcome = try await job.train(on: Fixture.dataset())
            guard case .reported = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            let (requests, heads, reports) = transport.log.withLock { ($0.modelRequests, $0.downloadHeads, $0.reports) }
            #expect(requests.map(\.offset) == [0, cut, 0])
            #expect(heads.map(\.start) == [0, cut, 0])
            let kept = [UInt8](try Data(contentsOf: job.directory.appendingPathComponent("model.safetensors")))
            #expect(heads.allSatisfy { $0.sha256 == ModelIntegrity.sha256(kept) })
            #expect(!FileManager.default.fileExists(atPath: partial.path))
            // The model trained on is the coordinator's: the diff equals a direct engine run's.
            let reported = try diffOf(try #require(reports.first))
            #expect(reported == (try referenceDiff(clientConfig: Self.config, seed: 42 &+ 1)))
        }
    }

    @Test("a model that never matches its announced SHA-256 is downloaded twice from byte zero, then refused")
    func persistentMismatch() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host(clientConfig: Self.config))
            let recording = RecordingTransport(WrongDigestTransport(inner: try HTTPTransport(url: harness.url)))
            let client = CoordinatorConnection(transport: recording, server: harness.url, configuration: harness.configuration(device: "liar"))
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let error = await #expect(throws: OrchardClientError.self) { try await job.train(on: Fixture.dataset()) }
            #expect(error?.code == .incompatibleModel)
            #expect(error?.message.contains("SHA-256") == true)
            #expect(recording.log.withLock { $0.modelRequests.map(\.offset) } == [0, 0])
            #expect(recording.log.withLock { $0.reportAttempts } == 0)
            #expect(!FileManager.default.fileExists(atPath: job.directory.appendingPathComponent("model.partial").path))
        }
    }

    @Test(
        "Repr-Digest values parse per RFC 9530; anything but a 32-byte sha-256 member is no digest",
        arguments: [
            ("sha-256=:\(Data(repeating: 7, count: 32).base64EncodedString()):", true),
            ("sha-512=:AAAA:, sha-256=:\(Data(repeating: 7, count: 32).base64EncodedString()):", true),
            ("sha-256=:AAAA:", false),
            ("sha-256=\(Data(repeating: 7, count: 32).base64EncodedString())", false),
            ("md5=:AAAA:", false),
        ])
    func digestParsing(field: String, valid: Bool) {
        let parsed = ModelIntegrity.parseSHA256(fieldValue: field)
        #expect((parsed == [UInt8](repeating: 7, count: 32)) == valid)
        #expect(valid == (parsed != nil))
    }
}
