public import OrchardProtocol

/// How a device talks to a coordinator: the device calls of the wire protocol.
///
/// ``HTTPTransport`` speaks HTTP; `OrchardInProcess`'s `InProcessTransport` calls a coordinator in the same process (simulator,
/// tests). Transports make one attempt per call; the client adds retries, backoff and resumption.
public protocol ClientTransport: Sendable {
    /// Proves the device's identity and joins a process.
    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse
    /// Asks to join the current cycle.
    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse
    /// Downloads the training plan of an assignment.
    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan
    /// Downloads the model's weights, from `request.offset` when resuming, streaming them into `sink`.
    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError)
    /// Uploads a report (a `ReportEnvelope`).
    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse
    /// Uploads a report of `byteCount` bytes that `body` reads (from the device's disk) only when the transport sends it,
    /// so that a transport that waits before sending does not hold the report in memory meanwhile. The default reads it
    /// at once and calls ``report(_:session:)``.
    func report(byteCount: Int, body: () throws(OrchardClientError) -> [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse
    /// Moves `bytes` bytes through the coordinator's speed-test endpoint (`Endpoint.speedTest`),
    /// `direction` from the device's side, with the device's session; returns the bytes moved. The client times it
    /// (``LinkSpeedTest``).
    func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int
    /// Sends one step of the device's secure aggregation (`Endpoint.secureAggregation`) with the
    /// device's session; returns what the device does next.
    func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply
    /// Sends the result of an evaluation task (`Endpoint.evaluationReport`) with the device's session.
    func evaluationReport(_ report: EvaluationReport, session: String) async throws(OrchardClientError) -> EvaluationReportResponse
}

extension ClientTransport {
    /// Reads the report at once and uploads it with ``report(_:session:)``.
    public func report(byteCount: Int, body: () throws(OrchardClientError) -> [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await report(try body(), session: session)
    }

    /// Transports with no link of their own (wrappers that only forward the five cycle calls) cannot take part
    /// in a process that asks for link speeds: they fail the measurement with this error, naming themselves.
    public func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        throw OrchardClientError(
            .invalidConfiguration,
            "\(Self.self) cannot run the coordinator's speed test, which this process requires; implement speedTest(_:bytes:session:) to forward it")
    }

    /// Transports that only forward the five cycle calls cannot take part in a process that uses secure
    /// aggregation: they fail its first step with this error, naming themselves.
    public func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        throw OrchardClientError(
            .invalidConfiguration,
            "\(Self.self) cannot send secure-aggregation messages, which this process requires; implement secureAggregation(_:session:) to forward them")
    }
}

extension ClientTransport {
    /// Transports that only forward the cycle calls cannot send evaluation results: the evaluation task fails with this
    /// error, naming the transport, and the window goes on to ask for training.
    public func evaluationReport(_ report: EvaluationReport, session: String) async throws(OrchardClientError) -> EvaluationReportResponse {
        throw OrchardClientError(
            .invalidConfiguration, "\(Self.self) cannot send evaluation results; implement evaluationReport(_:session:) to forward them")
    }
}

/// A model download, possibly resuming an earlier partial one.
public struct ModelRequest: Sendable, Hashable {
    /// The model's id from the assignment.
    public var modelID: String
    /// The assignment's request key.
    public var requestKey: String
    /// Bytes already held; the download continues from here.
    public var offset: Int
    /// The entity tag of the bytes already held; the server sends everything again when it changed.
    public var etag: String?
    /// The representation: safetensors weights (the SDK's), or an updatable Core ML model.
    public var format: ModelFormat

    /// Creates a request.
    public init(modelID: String, requestKey: String, offset: Int = 0, etag: String? = nil, format: ModelFormat = .safetensors) {
        self.modelID = modelID
        self.requestKey = requestKey
        self.offset = offset
        self.etag = etag
        self.format = format
    }
}

/// What a download's answer says before its bytes arrive.
public struct DownloadHead: Sendable, Hashable {
    /// Where the bytes that follow start in the whole file (0 when the server sent everything).
    public var start: Int
    /// The whole file's length, when known.
    public var totalLength: Int?
    /// The file's entity tag, when sent.
    public var etag: String?
    /// The SHA-256 of the whole file (not only of the bytes that follow), when sent (HTTP: `Repr-Digest`).
    public var sha256: [UInt8]?

    /// Creates a head.
    public init(start: Int, totalLength: Int?, etag: String?, sha256: [UInt8]? = nil) {
        self.start = start
        self.totalLength = totalLength
        self.etag = etag
        self.sha256 = sha256
    }
}

/// Receives a download as it arrives, so bytes received before a broken connection are kept.
public protocol DownloadSink: Sendable {
    /// Called once, before any bytes.
    func begin(_ head: DownloadHead) throws(OrchardClientError)
    /// Called with each chunk in order.
    func append(_ bytes: [UInt8]) throws(OrchardClientError)
}
