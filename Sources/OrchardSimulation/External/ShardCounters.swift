import Foundation
import OrchardSupport
import OrchardClient
import OrchardHTTPClient
import OrchardOperator
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import Logging
import Synchronization

/// A shard's device counters, shared by its devices.
final class ShardCounters: Sendable {
    struct Counts: Sendable {
        var checkIns = 0, admitted = 0, rejected = 0, reported = 0, dropped = 0, late = 0, failed = 0
        var rejections: [String: Int] = [:]
        var lastError: String?
        var workers: [Int: String] = [:]
        var reportsByDevice: [Int: Int] = [:]
        /// Devices whose last cycle failed in a way that retrying will not fix (credentials, TLS, the model).
        var broken: Set<Int> = []
    }

    private let state = Mutex(Counts())

    func snapshot() -> Counts { state.withLock { $0 } }
    func update(_ body: (inout Counts) -> Void) { state.withLock { body(&$0) } }
}

/// A device's transport: the shard's shared HTTP transport, counting check-ins and admissions and noting the
/// device's worker id.
struct CountingTransport: ClientTransport {
    let inner: any ClientTransport
    let device: Int
    let counters: ShardCounters

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        let response = try await inner.authenticate(request)
        counters.update { $0.workers[device] = response.workerID }
        return response
    }

    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        counters.update { $0.checkIns += 1 }
        let response = try await inner.requestCycle(request, session: session)
        if case .accepted = response { counters.update { $0.admitted += 1 } }
        return response
    }

    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }

    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        try await inner.downloadModel(request, session: session, into: sink)
    }

    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await inner.report(body, session: session)
    }

    func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        try await inner.speedTest(direction, bytes: bytes, session: session)
    }

    func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        try await inner.secureAggregation(request, session: session)
    }

    // Every call a device makes goes through: one this wrapper did not forward would reach the protocol's default,
    // which refuses it (federated evaluation's results were dropped that way).
    func report(byteCount: Int, body: () throws(OrchardClientError) -> [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await inner.report(byteCount: byteCount, body: body, session: session)
    }

    func evaluationReport(_ report: EvaluationReport, session: String) async throws(OrchardClientError) -> EvaluationReportResponse {
        try await inner.evaluationReport(report, session: session)
    }
}
