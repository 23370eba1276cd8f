import AsyncHTTPClient
public import Foundation
import NIOCore
import NIOHTTP1
package import NIOSSL
public import OrchardProtocol
public import OrchardSupport

/// The certificate authorities an HTTPS transport trusts.
public struct TrustRoots: Sendable, Hashable, CustomStringConvertible {
    private enum Source: Sendable, Hashable {
        case system
        case pem([UInt8], origin: String)
    }
    private let source: Source

    /// The platform's trust store.
    public static let system = TrustRoots(source: .system)

    /// Only the CA certificates in `pem` (one or more PEM certificates), e.g. a private CA's.
    public static func certificates(pem: String) -> TrustRoots {
        TrustRoots(source: .pem(Array(pem.utf8), origin: "the CA certificates given"))
    }

    /// Only the CA certificates in the PEM file at `path` (read when the transport is created).
    /// - Throws: ``OrchardClientError/Code/invalidConfiguration`` when the file is missing or unreadable.
    public static func certificateFile(_ path: String) throws(OrchardClientError) -> TrustRoots {
        let data: Data
        do throws(FileAccessError) { data = try LocalFile.read(path) } catch {
            throw OrchardClientError(.invalidConfiguration, "CA certificate file '\(path)': \(error.message)")
        }
        return TrustRoots(source: .pem([UInt8](data), origin: "CA certificate file '\(path)'"))
    }

    public var description: String {
        switch source {
        case .system: "the system's trust store"
        case .pem(_, let origin): origin
        }
    }

    /// The client TLS settings trusting these roots.
    package func tlsConfiguration() throws(OrchardClientError) -> TLSConfiguration {
        var configuration = TLSConfiguration.makeClientConfiguration()
        guard case .pem(let bytes, let origin) = source else { return configuration }
        let certificates: [NIOSSLCertificate]
        do {
            certificates = try NIOSSLCertificate.fromPEMBytes(bytes)
        } catch {
            throw OrchardClientError(.invalidConfiguration, "\(origin) is not PEM (\(error))")
        }
        guard !certificates.isEmpty else {
            throw OrchardClientError(.invalidConfiguration, "\(origin) holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        }
        configuration.trustRoots = .certificates(certificates)
        return configuration
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
    /// Seconds a request may wait to connect, and for each piece of data.
    public let timeout: Double
    /// The certificate authorities trusted for `https`.
    public let trustRoots: TrustRoots
    private let connection: Connection
    private let clock: any WallClock

    /// The largest JSON answer read (a plan with its model architecture included).
    static let maximumAnswerBytes = 64 << 20

    /// Creates a transport.
    /// - Parameters:
    ///   - url: The coordinator's base URL, `http` or `https` with a host.
    ///   - timeout: Seconds a request may wait to connect, and for each piece of data.
    ///   - trustRoots: The certificate authorities trusted for `https` (the system's by default).
    ///   - clock: The clock an HTTP-date `Retry-After` is read against.
    /// - Throws: ``OrchardClientError/Code/invalidConfiguration`` when the URL is not an absolute HTTP(S) URL, the
    ///   timeout is not positive, or the trust roots are not PEM certificates.
    public init(url: String, timeout: Double = 30, trustRoots: TrustRoots = .system, clock: any WallClock = SystemClock()) throws(OrchardClientError) {
        guard let parsed = URL(string: url), let scheme = parsed.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = parsed.host, !host.isEmpty
        else {
            throw OrchardClientError(.invalidConfiguration, "'\(url)' is not a coordinator URL such as https://fl.example.com or http://127.0.0.1:8080")
        }
        guard timeout > 0, timeout.isFinite else {
            throw OrchardClientError(.invalidConfiguration, "timeout must be a positive number of seconds, not \(timeout)")
        }
        baseURL = parsed
        self.timeout = timeout
        self.trustRoots = trustRoots
        self.clock = clock
        let wait = TimeAmount.nanoseconds(Int64(min(timeout, 86_400) * 1e9))
        var pool = HTTPClient.Configuration.ConnectionPool()
        // A failed connection (refused, TLS handshake) fails the call at once; the client's retry policy decides
        // whether to try again.
        pool.retryConnectionEstablishment = false
        let configuration = HTTPClient.Configuration(
            tlsConfiguration: try trustRoots.tlsConfiguration(), redirectConfiguration: .disallow,
            timeout: HTTPClient.Configuration.Timeout(connect: wait, read: wait), connectionPool: pool
        )
        connection = Connection(HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration))
    }

    public func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await exchange(.POST, Endpoint.authenticate, body: request, session: nil)
    }

    public func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await exchange(.POST, Endpoint.cycleRequest, body: request, session: session)
    }

    public func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        guard request.maskedInput != nil, request.maskedInputFormat == .safetensors else {
            // A poll, the most frequent request, is written directly.
            return try await exchange(.POST, Endpoint.secureAggregation, body: request, encoded: request.directJSON(), session: session)
        }
        return try await postSafetensors(MaskedInputEnvelope.encode(request), to: Endpoint.secureAggregation, session: session)
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
            let response = try await connection.client.execute(request, deadline: .distantFuture)
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

    /// An operator's call to the coordinator's admin API (`Endpoint.processes` and the paths under
    /// it) or another path of it such as `/metrics`, over this transport's connection and trust roots, with
    /// `Authorization: Bearer <adminToken>` and an optional JSON body. Answers the status and the body whatever the
    /// status (no retries; the fleet simulator's `--coordinator` mode hosts and watches its process with it).
    /// - Throws: ``OrchardClientError/Code/network`` or ``OrchardClientError/Code/tls`` when the coordinator cannot be
    ///   reached, ``OrchardClientError/Code/serverError`` for an answer larger than 64 MiB.
    public func adminRequest(_ method: String, _ path: String, json body: [UInt8]? = nil, adminToken: String) async throws(OrchardClientError) -> (status: Int, body: [UInt8]) {
        var request = try makeRequest(HTTPMethod(rawValue: method), path, session: adminToken)
        if let body {
            request.headers.replaceOrAdd(name: "Content-Type", value: MediaType.json)
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        let (bytes, head) = try await send(request)
        return (head.status, bytes)
    }

    // MARK: Helpers

    /// Owns the HTTP client and shuts it down when the last copy of the transport is gone.
    private final class Connection: Sendable {
        let client: HTTPClient
        init(_ client: HTTPClient) { self.client = client }
        deinit { client.shutdown { _ in } }
    }

    private struct Head {
        var status: Int
        var headers: HTTPHeaders
    }

    private func makeRequest(_ method: HTTPMethod, _ path: String, query: [String: String] = [:], session: String?) throws(OrchardClientError) -> HTTPClientRequest {
        guard var components = URLComponents(url: baseURL, resolvingAgainstBaseURL: false) else {
            throw OrchardClientError(.invalidConfiguration, "cannot build a request URL from \(baseURL)")
        }
        let prefix = components.path.hasSuffix("/") ? String(components.path.dropLast()) : components.path
        components.path = prefix + path
        if !query.isEmpty { components.queryItems = query.sorted { $0.key < $1.key }.map { URLQueryItem(name: $0.key, value: $0.value) } }
        guard let url = components.url else {
            throw OrchardClientError(.invalidConfiguration, "cannot build a request URL for \(path) from \(baseURL)")
        }
        var request = HTTPClientRequest(url: url.absoluteString)
        request.method = method
        request.headers.add(name: WireProtocol.versionHeader, value: WireProtocol.version.description)
        request.headers.add(name: "Accept", value: MediaType.json + ", " + MediaType.safetensors)
        if let session { request.headers.add(name: "Authorization", value: "Bearer \(session)") }
        return request
    }

    /// Sends `body` as JSON (`encoded` when the caller wrote it directly) and decodes the answer.
    private func exchange<Body: Encodable, Answer: Decodable>(_ method: HTTPMethod, _ path: String, body: Body, encoded: [UInt8]? = nil, session: String?) async throws(OrchardClientError) -> Answer {
        var request = try makeRequest(method, path, session: session)
        do {
            request.body = .bytes(ByteBuffer(bytes: try encoded ?? Array(WireCoding.encoder().encode(body))))
        } catch {
            throw OrchardClientError(.invalidConfiguration, "cannot encode \(Body.self): \(error)")
        }
        request.headers.replaceOrAdd(name: "Content-Type", value: MediaType.json)
        let (bytes, head) = try await send(request)
        return try decodeAnswer(Answer.self, bytes: bytes, head: head)
    }

    private func send(_ request: HTTPClientRequest) async throws(OrchardClientError) -> ([UInt8], Head) {
        do {
            let response = try await connection.client.execute(request, deadline: .distantFuture)
            let bytes = try await Self.collect(response.body, url: request.url)
            return (bytes, Head(status: Int(response.status.code), headers: response.headers))
        } catch let error as OrchardClientError {
            throw error
        } catch {
            throw Self.networkError(error, url: request.url)
        }
    }

    private static func collect(_ body: HTTPClientResponse.Body, url: String, limit: Int = HTTPTransport.maximumAnswerBytes) async throws -> [UInt8] {
        do {
            var buffer = try await body.collect(upTo: limit)
            return buffer.readBytes(length: buffer.readableBytes) ?? []
        } catch is NIOTooManyBytesError {
            throw OrchardClientError(.serverError, "the answer from \(url) exceeds \(limit) bytes")
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
        if error is CancellationError || Task.isCancelled { return cancelledError() }
        if let client = error as? HTTPClientError, client == .cancelled { return cancelledError() }
        if let tls = tlsFailure(error) {
            return OrchardClientError(
                .tls, "TLS connection to \(url) failed: \(tls); if the coordinator's certificate comes from a private CA, trust it (TrustRoots, orchard --ca-cert)"
            )
        }
        return OrchardClientError(.network, "request to \(url) failed: \(networkReason(error))")
    }

    /// A connection failure in a few words: NIO's own descriptions nest the OS error in parentheses of their own
    /// (`connection reset (error set): Connection refused) (errno: 111)`), which is no sentence to show anyone.
    static func networkReason(_ error: any Error) -> String {
        if let client = error as? HTTPClientError {
            switch client {
            case .connectTimeout: return "no connection within the timeout"
            case .readTimeout, .deadlineExceeded: return "no answer within the timeout"
            case .remoteConnectionClosed: return "the coordinator closed the connection"
            default: break
            }
        }
        let text = String(describing: error).split(whereSeparator: \.isNewline).joined(separator: " ")
        let lowered = text.lowercased()
        if lowered.contains("refused") { return "connection refused" }
        if ["unknownhost", "unknown host", "name or service not known", "nodename nor servname", "nxdomain"].contains(where: lowered.contains) {
            return "the host name cannot be resolved"
        }
        if lowered.contains("reset") { return "the connection was reset" }
        if lowered.contains("timed out") || lowered.contains("timeout") { return "the connection timed out" }
        return text
    }

    /// What went wrong in a TLS handshake, or nil when `error` is not a TLS failure.
    private static func tlsFailure(_ error: any Error) -> String? {
        if let error = error as? NIOSSLError {
            switch error {
            case .handshakeFailed(let reasons):
                let text = "\(reasons)"
                return text.contains("CERTIFICATE_VERIFY_FAILED") ? "the server's certificate is not trusted (\(text))" : "the handshake failed (\(text))"
            case .unableToValidateCertificate: return "the server's certificate cannot be validated"
            default: return "\(error)"
            }
        }
        if let error = error as? NIOSSLExtraError, error == .failedToValidateHostname {
            return "the server's certificate is not for this host"
        }
        if let error = error as? BoringSSLError { return "\(error)" }
        return nil
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
