import Foundation
import OrchardClient
import OrchardProtocol
@testable import OrchardSimulation
import Synchronization
import Testing

/// A shard's devices reach the coordinator through a counting wrapper: every call a device makes must go through it.
@Suite struct ShardTransportTests {
    /// The inner transport: answers evaluation results and late-read reports, and records that it did.
    final class Inner: ClientTransport, Sendable {
        let calls = Mutex<[String]>([])
        func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
            throw OrchardClientError(.network, "not used")
        }
        func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
            throw OrchardClientError(.network, "not used")
        }
        func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
            throw OrchardClientError(.network, "not used")
        }
        func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
            throw OrchardClientError(.network, "not used")
        }
        func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
            calls.withLock { $0.append("report") }
            return ReportResponse(cycle: 1, reportsReceived: 1, retryAfter: 0)
        }
        func report(byteCount: Int, body: () throws(OrchardClientError) -> [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
            calls.withLock { $0.append("report(byteCount: \(byteCount))") }
            return ReportResponse(cycle: 1, reportsReceived: 1, retryAfter: 0)
        }
        func evaluationReport(_ report: EvaluationReport, session: String) async throws(OrchardClientError) -> EvaluationReportResponse {
            calls.withLock { $0.append("evaluationReport") }
            return EvaluationReportResponse(checkpoint: 2, resultsReceived: 1)
        }
    }

    @Test func evaluationResultsAndLateReadReportsAreForwarded() async throws {
        let inner = Inner()
        let transport = CountingTransport(inner: inner, device: 0, counters: ShardCounters())
        let answer = try await transport.evaluationReport(EvaluationReport(workerID: "w", requestKey: "k", samples: 4, metrics: ["loss": 1]), session: "s")
        #expect(answer.resultsReceived == 1)
        _ = try await transport.report(byteCount: 3, body: { () throws(OrchardClientError) -> [UInt8] in [1, 2, 3] }, session: "s")
        #expect(inner.calls.withLock { $0 } == ["evaluationReport", "report(byteCount: 3)"])
    }
}
