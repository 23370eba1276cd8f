import AsyncHTTPClient
public import Foundation
import NIOCore
import NIOHTTP1
public import OrchardHTTPClient
public import OrchardProtocol
public import OrchardSupport

/// A secure-aggregation request as it goes on the wire: a masked input in its safetensors envelope, anything else
/// as JSON (a poll, the most frequent request, written directly).
package struct SecureAggregationBody: Sendable {
    /// The body's bytes.
    package let bytes: [UInt8]
    /// Whether the body is a safetensors envelope (else JSON).
    package let isSafetensors: Bool

    /// Encodes `request`.
    /// - Throws: `invalid_configuration` when it cannot be encoded.
    package init(_ request: SecureAggregationRequest) throws(OrchardClientError) {
        if request.maskedInput != nil, request.maskedInputFormat == .safetensors {
            bytes = MaskedInputEnvelope.encode(request)
            isSafetensors = true
            return
        }
        isSafetensors = false
        if let direct = request.directJSON() {
            bytes = direct
            return
        }
        do { bytes = Array(try WireCoding.encoder().encode(request)) } catch {
            throw OrchardClientError(.invalidConfiguration, "cannot encode SecureAggregationRequest: \(error)")
        }
    }
}

/// The coordinator's HTTP API over AsyncHTTPClient (SwiftNIO; Network.framework on Apple platforms), HTTPS with the
/// system's or a private CA's trust roots.
///
/// Every call has a timeout for connecting and for each wait for data; model downloads stream into their sink as
/// bytes arrive, send `Range` and `If-Range` when resuming, and report where the served bytes start and the whole
/// file's SHA-256 (RFC 9530 `Repr-Digest: sha-256=:<base64>:`). A 429 or 503 answer's `Retry-After` becomes the
/// error's ``OrchardClientError/retryAfter``.
public struct HTTPTransport: ClientTransport {
    /// The coordinator's base URL.
    public let baseURL: URL
    /// How long a request may wait to connect, and for each piece of data.
    public let timeout: Duration
    /// The certificate authorities trusted for `https`.
    public let trustRoots: TrustRoots
    private let connection: HTTPConnection
    private let clock: any WallClock

    /// The largest JSON answer read (a plan with its model architecture included).
    static let maximumAnswerBytes = 64 << 20

    /// Creates a transport.
    /// - Parameters:
    ///   - url: The coordinator's base URL, `http` or `https` with a host.
    ///   - timeout: How long a request may wait to connect, and for each piece of data.
    ///   - trustRoots: The certificate authorities trusted for `https` (the system's by default).
    ///   - clock: The clock an HTTP-date `Retry-After` is read against.
    /// - Throws: ``OrchardClientError/Code/invalidConfiguration`` when the URL is not an absolute HTTP(S) URL, the
    ///   timeout is not positive, or the trust roots are not PEM certificates.
    public init(url: String, timeout: Duration = .seconds(30), trustRoots: TrustRoots = .system, clock: any WallClock = SystemClock())
        throws(OrchardClientError)
    {
        guard let parsed = HTTPConnection.baseURL(url) else {
            throw OrchardClientError(.invalidConfiguration, "'\(url)' is not a coordinator URL such as https://fl.example.com or http://127.0.0.1:8080")
        }
        baseURL = parsed
        self.timeout = timeout
        self.trustRoots = trustRoots
        self.clock = clock
        do throws(ConnectionError) {
            connection = try HTTPConnection(timeout: timeout, trustRoots: trustRoots)
        } catch {
            throw OrchardClientError(.invalidConfiguration, error.message)
        }
    }

    public func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await exchange(.POST, Endpoint.authenticate, body: request, session: nil)
    }

    public func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await exchange(.POST, Endpoint.cycleRequest, body: request, session: session)
    }

    public func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        try await secureAggregation(try SecureAggregationBody(request), session: session).reply
    }

    /// Sends an encoded secure-aggregation request; returns the reply and the answer's size on the wire.
    package func secureAggregation(_ body: SecureAggregationBody, session: String) async throws(OrchardClientError) -> (
        reply: SecureAggregationReply, answerBytes: Int
    ) {
        var http = try makeRequest(.POST, Endpoint.secureAggregation, session: session)
        http.headers.replaceOrAdd(name: "Content-Type", value: body.isSafetensors ? MediaType.safetensors : MediaType.json)
        http.body = .bytes(ByteBuffer(bytes: body.bytes))
        let (bytes, head) = try await send(http)
        // A wait, most of the replies, is read directly; anything else takes the decoder.
        if (200..<300).contains(head.status), let reply = bytes.withUnsafeBytes({ SecureAggregationReply.directDecode($0) }) {
            return (reply, bytes.count)
        }
        return (try decodeAnswer(SecureAggregationReply.self, bytes: bytes, head: head), bytes.count)
    }

    public func evaluationReport(_ report: EvaluationReport, session: String) async throws(OrchardClientError) -> EvaluationReportResponse {
        try await exchange(.POST, Endpoint.evaluationReport, body: report, session: session)
    }

    public func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        let request = try makeRequest(.GET, Endpoint.plan(planID), query: [Endpoint.requestKeyQuery: requestKey], session: session)
        let (bytes, head) = try await send(request)
        return try decodeAnswer(TrainingPlan.self, bytes: bytes, head: head)
    }

    public func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await postSafetensors(body, to: Endpoint.report, session: session)
    }

    /// Posts a safetensors body (a report, a masked input) and decodes the JSON answer.
    private func postSafetensors<Answer: Decodable>(_ body: [UInt8], to path: String, session: String) async throws(OrchardClientError) -> Answer {
        var request = try makeRequest(.POST, path, session: session)
        request.headers.replaceOrAdd(name: "Content-Type", value: MediaType.safetensors)
        request.body = .bytes(ByteBuffer(bytes: body))
        let (bytes, head) = try await send(request)
        return try decodeAnswer(Answer.self, bytes: bytes, head: head)
    }

    public func downloadModel(_ model: ModelRequest, session token: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        var query = [Endpoint.requestKeyQuery: model.requestKey]
        if model.format != .safetensors { query[Endpoint.formatQuery] = model.format.rawValue }
        var request = try makeRequest(.GET, Endpoint.model(model.modelID), query: query, session: token)
        if model.offset > 0 {
            request.headers.replaceOrAdd(name: "Range", value: "bytes=\(model.offset)-")
            if let etag = model.etag { request.headers.replaceOrAdd(name: "If-Range", value: etag) }
        }
        let url = request.url
        do {
            let response = try await connection.execute(request)
            let status = Int(response.status.code)
            guard status == 200 || status == 206 else {
                let bytes = try await Self.collect(response.body, url: url)
                throw serverError(status: status, bytes: bytes, headers: response.headers)
            }
            let etag = response.headers.first(name: "ETag")
            let digest = response.headers.first(name: ModelIntegrity.digestHeader).flatMap { ModelIntegrity.parseSHA256(fieldValue: $0) }
            let head: DownloadHead
            if status == 206 {
                guard let range = response.headers.first(name: "Content-Range"), let parsed = Self.parseContentRange(range) else {
                    throw OrchardClientError(.serverError, "206 answer without a valid Content-Range", httpStatus: 206)
                }
                head = DownloadHead(start: parsed.start, totalLength: parsed.total, etag: etag, sha256: digest)
            } else {
                head = DownloadHead(start: 0, totalLength: response.headers.first(name: "Content-Length").flatMap { Int($0) }, etag: etag, sha256: digest)
            }
            try sink.begin(head)
            for try await chunk in response.body {
                try checkCancellation()
                try sink.append(Array(chunk.readableBytesView))
            }
        } catch let error as OrchardClientError {
            throw error
        } catch {
            throw Self.networkError(error, url: url)
        }
    }

    public func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        if direction == .download {
            let request = try makeRequest(.GET, Endpoint.speedTest, query: [Endpoint.bytesQuery: String(bytes)], session: session)
            let (data, head) = try await send(request)
            guard (200..<300).contains(head.status) else { throw serverError(status: head.status, bytes: data, headers: head.headers) }
            return data.count
        }
        var request = try makeRequest(.POST, Endpoint.speedTest, session: session)
        request.headers.replaceOrAdd(name: "Content-Type", value: "application/octet-stream")
        request.body = .bytes(ByteBuffer(repeating: 0x5A, count: max(bytes, 0)))
        let (data, head) = try await send(request)
        return try decodeAnswer(SpeedTestUploadResponse.self, bytes: data, head: head).bytes
    }

    // MARK: Helpers

    private struct Head {
        var status: Int
        var headers: HTTPHeaders
    }

    private func makeRequest(_ method: HTTPMethod, _ path: String, query: [String: String] = [:], session: String?) throws(OrchardClientError)
        -> HTTPClientRequest
    {
        let url: String
        do throws(ConnectionError) { url = try HTTPConnection.url(baseURL, path: path, query: query) } catch {
            throw OrchardClientError(.invalidConfiguration, error.message)
        }
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers.add(name: WireProtocol.versionHeader, value: WireProtocol.version.description)
        request.headers.add(name: "Accept", value: MediaType.json + ", " + MediaType.safetensors)
        if let session { request.headers.add(name: "Authorization", value: "Bearer \(session)") }
        return request
    }

    /// Sends `body` as JSON and decodes the answer.
    private func exchange<Body: Encodable, Answer: Decodable>(_ method: HTTPMethod, _ path: String, body: Body, session: String?)
        async throws(OrchardClientError) -> Answer
    {
        var request = try makeRequest(method, path, session: session)
        do {
            request.body = .bytes(ByteBuffer(bytes: Array(try WireCoding.encoder().encode(body))))
        } catch {
            throw OrchardClientError(.invalidConfiguration, "cannot encode \(Body.self): \(error)")
        }
        request.headers.replaceOrAdd(name: "Content-Type", value: MediaType.json)
        let (bytes, head) = try await send(request)
        return try decodeAnswer(Answer.self, bytes: bytes, head: head)
    }

    private func send(_ request: HTTPClientRequest) async throws(OrchardClientError) -> ([UInt8], Head) {
        do throws(ConnectionError) {
            let answer = try await connection.send(request, limit: Self.maximumAnswerBytes)
            return (answer.body, Head(status: answer.status, headers: answer.headers))
        } catch {
            throw Self.clientError(error, url: request.url)
        }
    }

    private static func collect(_ body: HTTPClientResponse.Body, url: String) async throws(OrchardClientError) -> [UInt8] {
        do throws(ConnectionError) { return try await HTTPConnection.collect(body, limit: maximumAnswerBytes) } catch {
            throw clientError(error, url: url)
        }
    }

    private func decodeAnswer<Answer: Decodable>(_ type: Answer.Type, bytes: [UInt8], head: Head) throws(OrchardClientError) -> Answer {
        guard (200..<300).contains(head.status) else { throw serverError(status: head.status, bytes: bytes, headers: head.headers) }
        do {
            return try WireCoding.decoder().decode(Answer.self, from: Data(bytes))
        } catch {
            throw OrchardClientError(.serverError, "the coordinator's answer is not a valid \(Answer.self): \(error)", httpStatus: head.status)
        }
    }

    /// The error of a non-2xx answer, with the `Retry-After` of a 429 or 503.
    private func serverError(status: Int, bytes: [UInt8], headers: HTTPHeaders) -> OrchardClientError {
        let retryAfter = status == 429 || status == 503 ? headers.first(name: "Retry-After").flatMap { RetryAfter.seconds($0, now: clock.date) } : nil
        return OrchardClientError.server(status: status, body: try? WireCoding.decoder().decode(ErrorBody.self, from: Data(bytes)), retryAfter: retryAfter)
    }

    /// Maps a connection failure to a client error: cancellation, a TLS failure (not retried: the certificate will
    /// not change by itself), or a network error.
    package static func networkError(_ error: any Error, url: String) -> OrchardClientError {
        clientError(HTTPConnection.failure(error), url: url)
    }

    /// The client error of a connection failure on `url`.
    static func clientError(_ error: ConnectionError, url: String) -> OrchardClientError {
        switch error.code {
        case .cancelled: return cancelledError()
        case .tls:
            return OrchardClientError(
                .tls,
                "TLS connection to \(url) failed: \(error.message); if the coordinator's certificate comes from a private CA, trust it (TrustRoots, orchard --ca-cert)"
            )
        case .answerTooLarge: return OrchardClientError(.serverError, "the answer from \(url) exceeds \(maximumAnswerBytes) bytes")
        case .invalidConfiguration: return OrchardClientError(.invalidConfiguration, error.message)
        default: return OrchardClientError(.network, "request to \(url) failed: \(error.message)")
        }
    }

    /// Parses `bytes a-b/total`.
    static func parseContentRange(_ value: String) -> (start: Int, total: Int?)? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        guard trimmed.hasPrefix("bytes ") else { return nil }
        let spec = trimmed.dropFirst(6)
        let parts = spec.split(separator: "/", maxSplits: 1)
        guard parts.count == 2, let dash = parts[0].firstIndex(of: "-"), let start = Int(parts[0][..<dash]) else { return nil }
        return (start, parts[1] == "*" ? nil : Int(parts[1]))
    }
}
