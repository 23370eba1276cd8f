public import OrchardClient
public import OrchardCoordinator
public import OrchardProtocol

/// The device transport to a coordinator in the same process (simulator, tests, single-process apps): calls the
/// coordinator's core directly, with no sockets and no serialisation of control messages, and the same semantics
/// as HTTP — session tokens resolved by the core, ranges and entity tags by ``OrchardCoordinator/DownloadSelection``,
/// errors mapped to client errors with the status the HTTP edge sends.
public struct InProcessTransport: ClientTransport {
    /// The coordinator called.
    public let coordinator: Coordinator
    /// The models' digests, computed once per entity tag (as the HTTP edge does).
    private let digests = RepresentationDigests()

    /// Creates a transport to `coordinator`.
    public init(coordinator: Coordinator) { self.coordinator = coordinator }

    private func mapped<T>(_ body: () async throws(CoordinatorError) -> T) async throws(OrchardClientError) -> T {
        do {
            return try await body()
        } catch {
            throw OrchardClientError.server(status: error.httpStatus, body: error.body, retryAfter: error.retryAfter)
        }
    }

    public func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await mapped { () async throws(CoordinatorError) in try await coordinator.authenticate(request) }
    }

    public func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await mapped { () async throws(CoordinatorError) in
            let proven = try await coordinator.session(forToken: session)
            return try await coordinator.requestCycle(request, session: proven)
        }
    }

    public func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        try await mapped { () async throws(CoordinatorError) in
            let proven = try await coordinator.session(forToken: session)
            return try await coordinator.secureAggregation(request, session: proven)
        }
    }

    public func evaluationReport(_ report: EvaluationReport, session: String) async throws(OrchardClientError) -> EvaluationReportResponse {
        try await mapped { () async throws(CoordinatorError) in
            let proven = try await coordinator.session(forToken: session)
            return try await coordinator.evaluationReport(report, session: proven)
        }
    }

    public func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await mapped { () async throws(CoordinatorError) in
            let proven = try await coordinator.session(forToken: session)
            return try await coordinator.plan(planID, requestKey: requestKey, session: proven)
        }
    }

    public func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        let (bytes, etag, selection) = try await mapped { () async throws(CoordinatorError) in
            let proven = try await coordinator.session(forToken: session)
            let download = try await coordinator.model(request.modelID, requestKey: request.requestKey, session: proven, format: request.format)
            // What the HTTP transport asks for: the rest of the held bytes, if they are of the same entity.
            let range = request.offset > 0 && request.etag != nil ? "bytes=\(request.offset)-" : nil
            let selection = try DownloadSelection.select(
                total: download.bytes.count, etag: download.etag, range: range, ifRange: request.etag, ifNoneMatch: nil)
            return (download.bytes, download.etag, selection)
        }
        let start: Int
        switch selection {
        case .partial(let range): start = range.lowerBound
        case .whole, .notModified: start = 0
        }
        // The digest HTTP sends as `Repr-Digest`; here the bytes never leave memory, so it guards the partial file on disk.
        try sink.begin(DownloadHead(start: start, totalLength: bytes.count, etag: etag, sha256: digests.sha256(of: bytes, etag: etag)))
        try sink.append(Array(bytes[start...]))
    }

    public func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await mapped { () async throws(CoordinatorError) in
            let proven = try await coordinator.session(forToken: session)
            return try await coordinator.report(body, session: proven)
        }
    }

    /// There is no link in the same process: the coordinator admits the transfer as over HTTP (session, the process's
    /// sizes, the per-worker rate limit), and every byte asked for arrives at once.
    public func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        try await mapped { () async throws(CoordinatorError) in
            let proven = try await coordinator.session(forToken: session)
            guard bytes >= 1 else { throw CoordinatorError(.invalidRequest, "bytes must be a positive integer") }
            _ = try await coordinator.admitSpeedTest(direction == .download ? .download : .upload, requested: bytes, session: proven)
            return bytes
        }
    }
}
