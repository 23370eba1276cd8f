import AsyncHTTPClient
public import Foundation
import OrchardSupport
import NIOCore
import NIOHTTP1
import NIOSSL
import OrchardFormats
public import OrchardProtocol

/// A coordinator's answer: the decoded value and the JSON exactly as the coordinator sent it (for `--json`).
public struct AdminAnswer<Value: Sendable>: Sendable {
    /// The decoded answer.
    public var value: Value
    /// The answer's body as sent.
    public var json: [UInt8]
}

/// A stored checkpoint fetched from the coordinator.
public struct FetchedCheckpoint: Sendable {
    /// Its number (from the file's `orchard.checkpoint` metadata; nil if absent).
    public var number: Int?
    /// The safetensors bytes.
    public var bytes: [UInt8]
}

/// Which checkpoint to fetch: a number or the latest.
public enum CheckpointSelector: Sendable, Hashable, CustomStringConvertible {
    /// The latest published checkpoint.
    case latest
    /// Checkpoint `n` (0 is the initial weights).
    case number(Int)

    /// Parses `latest` or a non-negative number.
    public init?(_ text: String) {
        if text == "latest" { self = .latest; return }
        guard let n = Int(text), n >= 0 else { return nil }
        self = .number(n)
    }

    public var description: String {
        switch self {
        case .latest: "latest"
        case .number(let n): "\(n)"
        }
    }
}

/// The coordinator's admin API (`/v1/admin/processes…`) over AsyncHTTPClient, with `Authorization: Bearer <admin
/// token>`, for `orchard process`. Every failure is an ``OperatorError`` whose description is one line: the
/// coordinator's own `code: message`, `unauthorized` when it refuses the token, `unreachable` naming the URL when
/// it cannot be reached, `tls` when the handshake fails.
public final class AdminClient: Sendable {
    /// The coordinator's base URL.
    public let baseURL: URL
    /// Seconds a request may wait to connect, and for each piece of the answer.
    public let timeout: Double
    private let adminToken: String
    private let client: HTTPClient

    /// The largest JSON answer read.
    static let maximumJSONBytes = 64 << 20
    /// The largest checkpoint read.
    static let maximumCheckpointBytes = Int(UInt32.max)

    /// Creates a client.
    /// - Parameters:
    ///   - server: The coordinator's base URL, `http://…` or `https://…`.
    ///   - adminToken: The admin token (see ``AdminToken``).
    ///   - caCertificateFile: A PEM file of CA certificates to trust (alone) for an `https` server.
    ///   - timeout: Seconds to connect and to wait for each piece of an answer.
    /// - Throws: ``OperatorError`` (`invalid_argument`, `missing_file`) for a bad URL, timeout or CA file.
    public init(server: String, adminToken: String, caCertificateFile: String? = nil, timeout: Double = 30) throws(OperatorError) {
        guard let url = URL(string: server), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = url.host, !host.isEmpty
        else {
            throw OperatorError(.invalidArgument, "--server '\(server)' is not a coordinator URL such as http://127.0.0.1:8080 or https://fl.example.com")
        }
        guard timeout > 0, timeout.isFinite else {
            throw OperatorError(.invalidArgument, "--timeout must be a positive number of seconds, not \(timeout)")
        }
        var tls = TLSConfiguration.makeClientConfiguration()
        if let caCertificateFile {
            let pem: Data
            do throws(FileAccessError) { pem = try LocalFile.read(caCertificateFile) } catch {
                throw OperatorError(.missingFile, "--ca-cert '\(caCertificateFile)': \(error.message)")
            }
            let certificates: [NIOSSLCertificate]
            do {
                certificates = try NIOSSLCertificate.fromPEMBytes([UInt8](pem))
            } catch {
                throw OperatorError(.invalidArgument, "--ca-cert '\(caCertificateFile)' is not a PEM certificate file")
            }
            guard !certificates.isEmpty else {
                throw OperatorError(.invalidArgument, "--ca-cert '\(caCertificateFile)' holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
            }
            tls.trustRoots = .certificates(certificates)
        }
        baseURL = url
        self.timeout = timeout
        self.adminToken = adminToken
        let wait = TimeAmount.nanoseconds(Int64(min(timeout, 86_400) * 1e9))
        var pool = HTTPClient.Configuration.ConnectionPool()
        pool.retryConnectionEstablishment = false
        client = HTTPClient(
            eventLoopGroup: HTTPClient.defaultEventLoopGroup,
            configuration: HTTPClient.Configuration(
                tlsConfiguration: tls, redirectConfiguration: .disallow, timeout: HTTPClient.Configuration.Timeout(connect: wait, read: wait),
                connectionPool: pool
            )
        )
    }

    deinit { client.shutdown { _ in } }

    /// `POST /v1/admin/processes`: hosts a process (201 with its status).
    public func host(_ request: HostProcessRequest) async throws(OperatorError) -> AdminAnswer<ProcessStatus> {
        let body: Data
        do {
            body = try WireCoding.encoder().encode(request)
        } catch {
            throw OperatorError(.invalidConfiguration, "cannot encode the request: \(error)")
        }
        return try await json(.POST, Endpoint.processes, body: [UInt8](body))
    }

    /// `GET /v1/admin/processes`: every hosted process.
    public func processes() async throws(OperatorError) -> AdminAnswer<ProcessList> {
        try await json(.GET, Endpoint.processes)
    }

    /// `GET /v1/admin/processes/{id}`: one process and its open cycle.
    public func status(_ processID: String) async throws(OperatorError) -> AdminAnswer<ProcessStatus> {
        try await json(.GET, Endpoint.process(try Self.pathComponent(processID)))
    }

    /// `GET /v1/admin/processes/{id}/checkpoints/{n|latest}`: a stored checkpoint.
    public func checkpoint(_ processID: String, _ which: CheckpointSelector) async throws(OperatorError) -> FetchedCheckpoint {
        let (status, bytes, url) = try await send(.GET, Endpoint.checkpoint(try Self.pathComponent(processID), which.description), limit: Self.maximumCheckpointBytes)
        guard (200..<300).contains(status) else { throw serverError(status: status, bytes: bytes, url: url) }
        let metadata: [String: String]
        do throws(FormatError) {
            metadata = try Safetensors.index(bytes).metadata
        } catch {
            throw OperatorError(.unexpectedAnswer, "the checkpoint from \(url) is not safetensors: \(error.message)", httpStatus: status)
        }
        return FetchedCheckpoint(number: metadata["orchard.checkpoint"].flatMap { Int($0) }, bytes: bytes)
    }

    /// `DELETE /v1/admin/processes/{id}`.
    public func delete(_ processID: String) async throws(OperatorError) {
        let (status, bytes, url) = try await send(.DELETE, Endpoint.process(try Self.pathComponent(processID)), limit: Self.maximumJSONBytes)
        guard (200..<300).contains(status) else { throw serverError(status: status, bytes: bytes, url: url) }
    }

    /// Shuts the HTTP client down (otherwise done when the client is released).
    public func shutdown() async {
        try? await client.shutdown()
    }

    // MARK: Plumbing

    /// A process id as one path component; ids have the shape `p_` + 16 hex digits, anything else cannot name one.
    static func pathComponent(_ processID: String) throws(OperatorError) -> String {
        guard !processID.isEmpty, processID.unicodeScalars.allSatisfy({ $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "_" || $0 == "-") }) else {
            throw OperatorError(.invalidArgument, "'\(processID)' is not a process id (ids look like p_0123456789abcdef; `orchard process list` shows them)")
        }
        return processID
    }

    private func json<Answer: Decodable & Sendable>(_ method: HTTPMethod, _ path: String, body: [UInt8]? = nil) async throws(OperatorError) -> AdminAnswer<Answer> {
        let (status, bytes, url) = try await send(method, path, body: body, limit: Self.maximumJSONBytes)
        guard (200..<300).contains(status) else { throw serverError(status: status, bytes: bytes, url: url) }
        do {
            return AdminAnswer(value: try WireCoding.decoder().decode(Answer.self, from: Data(bytes)), json: bytes)
        } catch {
            throw OperatorError(.unexpectedAnswer, "the answer from \(url) is not a valid \(Answer.self); is --server an Orchard coordinator of this version?", httpStatus: status)
        }
    }

    private func send(_ method: HTTPMethod, _ path: String, body: [UInt8]? = nil, limit: Int) async throws(OperatorError) -> (Int, [UInt8], String) {
        let prefix = baseURL.path.hasSuffix("/") ? String(baseURL.path.dropLast()) : baseURL.path
        guard var components = URLComponents(url: baseURL, resolvingAgainstBaseURL: false) else {
            throw OperatorError(.invalidArgument, "cannot build a request URL from \(baseURL)")
        }
        components.path = prefix + path
        components.query = nil
        guard let url = components.url?.absoluteString else {
            throw OperatorError(.invalidArgument, "cannot build a request URL for \(path) from \(baseURL)")
        }
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers.add(name: WireProtocol.versionHeader, value: WireProtocol.version.description)
        request.headers.add(name: "Accept", value: MediaType.json + ", " + MediaType.safetensors)
        request.headers.add(name: "Authorization", value: "Bearer \(adminToken)")
        if let body {
            request.headers.add(name: "Content-Type", value: MediaType.json)
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        do {
            let response = try await client.execute(request, timeout: .nanoseconds(Int64(min(timeout, 86_400) * 1e9)))
            var buffer = try await response.body.collect(upTo: limit)
            return (Int(response.status.code), buffer.readBytes(length: buffer.readableBytes) ?? [], url)
        } catch is NIOTooManyBytesError {
            throw OperatorError(.unexpectedAnswer, "the answer from \(url) exceeds \(limit) bytes")
        } catch {
            throw Self.connectionError(error, server: baseURL.absoluteString, timeout: timeout)
        }
    }

    /// The error of a non-2xx answer: the coordinator's code and message; a refused token says so.
    func serverError(status: Int, bytes: [UInt8], url: String) -> OperatorError {
        let body = try? WireCoding.decoder().decode(ErrorBody.self, from: Data(bytes))
        if status == 401 {
            let detail = body.map { " (\($0.error.message))" } ?? ""
            return OperatorError(
                .unauthorized, "the admin token was refused by \(baseURL.absoluteString)\(detail); check \(AdminToken.environmentVariable) or --admin-token-file",
                httpStatus: status
            )
        }
        guard let body else {
            return OperatorError(
                .unexpectedAnswer, "HTTP \(status) from \(url) without an Orchard error body; is --server an Orchard coordinator?", httpStatus: status
            )
        }
        return OperatorError(.server(body.error.code), body.error.message, httpStatus: status)
    }

    /// A failure to talk to the coordinator at all: TLS, refused, timed out, unknown host.
    static func connectionError(_ error: any Error, server: String, timeout: Double) -> OperatorError {
        if let reason = tlsFailure(error) {
            return OperatorError(.tls, "TLS connection to \(server) failed: \(reason); for a coordinator whose certificate comes from a private CA, give --ca-cert FILE")
        }
        let text = String(describing: error)
        let lowered = text.lowercased()
        let reason: String
        if let client = error as? HTTPClientError, client == .connectTimeout || client == .deadlineExceeded || client == .readTimeout {
            reason = "no answer within \(timeout.formatted()) s"
        } else if lowered.contains("refused") {
            reason = "connection refused"
        } else if ["unknownhost", "unknown host", "name or service not known", "nodename nor servname", "nxdomain", "resolve"].contains(where: lowered.contains) {
            reason = "its host name cannot be resolved"
        } else if error is HTTPClientError {
            reason = text
        } else {
            reason = text.split(whereSeparator: \.isNewline).joined(separator: " ")
        }
        return OperatorError(.unreachable, "cannot reach the coordinator at \(server) (\(reason)); check that `orchard serve` is running there and --server is right")
    }

    private static func tlsFailure(_ error: any Error) -> String? {
        if let error = error as? NIOSSLError {
            switch error {
            case .handshakeFailed(let reasons):
                let text = "\(reasons)"
                return text.contains("CERTIFICATE_VERIFY_FAILED") ? "the server's certificate is not trusted" : "the handshake failed (\(text))"
            case .unableToValidateCertificate: return "the server's certificate cannot be validated"
            default: return "\(error)"
            }
        }
        if let error = error as? NIOSSLExtraError, error == .failedToValidateHostname { return "the server's certificate is not for this host" }
        if let error = error as? BoringSSLError { return "\(error)" }
        return nil
    }
}

extension Double {
    fileprivate func formatted() -> String {
        self == rounded() && abs(self) < 1e15 ? String(Int64(self)) : String(self)
    }
}
