public import OrchardProtocol

/// A coordinator reachable in the same process: the device calls of the coordinator's core, with its errors
/// already mapped to ``OrchardClientError`` (use ``OrchardClientError/server(status:body:)``).
///
/// The coordinator's actor conforms through a small adapter (the simulator and the SDK's tests provide one), so
/// this module does not depend on the server.
public protocol InProcessCoordinator: Sendable {
    /// Authenticates a device.
    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse
    /// Handles a cycle request from the worker holding `session`.
    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse
    /// The training plan of an assignment.
    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan
    /// The whole model of an assignment and its entity tag.
    func model(_ modelID: String, requestKey: String, session: String) async throws(OrchardClientError) -> (bytes: [UInt8], etag: String)
    /// Accepts a report.
    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse
}

/// A transport that calls an ``InProcessCoordinator`` directly: no sockets, no serialisation of control
/// messages, the same semantics as HTTP (ranges, entity tags, error codes). For the simulator and tests.
public struct InMemoryTransport: ClientTransport {
    /// The coordinator called.
    public let coordinator: any InProcessCoordinator

    /// Creates a transport.
    public init(coordinator: any InProcessCoordinator) { self.coordinator = coordinator }

    public func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await coordinator.authenticate(request)
    }

    public func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await coordinator.requestCycle(request, session: session)
    }

    public func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await coordinator.plan(planID, requestKey: requestKey, session: session)
    }

    public func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        let (bytes, etag) = try await coordinator.model(request.modelID, requestKey: request.requestKey, session: session)
        // Same rule as HTTP `If-Range`: a range is served only when the held bytes are of the same entity.
        let resumes = request.offset > 0 && request.etag == etag
        if resumes && request.offset >= bytes.count {
            throw OrchardClientError(.serverError, "range starting at \(request.offset) cannot be served from \(bytes.count) bytes", httpStatus: 416, serverCode: .rangeNotSatisfiable)
        }
        let start = resumes ? request.offset : 0
        // The digest HTTP sends as `Repr-Digest`; here the bytes never leave memory, so it guards the partial
        // file on disk.
        try sink.begin(DownloadHead(start: start, totalLength: bytes.count, etag: etag, sha256: ModelIntegrity.sha256(bytes)))
        try sink.append(Array(bytes[start...]))
    }

    public func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await coordinator.report(body, session: session)
    }

    /// There is no link in memory: the coordinator's limits and error apply, and every byte asked for arrives.
    public func speedTest(_ direction: SpeedTestDirection, bytes: Int) async throws(OrchardClientError) -> Int {
        guard (1...SpeedTest.maximumBytes).contains(bytes) else {
            let body = ErrorBody(code: .invalidRequest, message: "bytes must be an integer in 1...\(SpeedTest.maximumBytes)")
            throw OrchardClientError.server(status: 400, body: body)
        }
        return bytes
    }
}
