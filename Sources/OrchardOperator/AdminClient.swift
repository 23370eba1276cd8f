import AsyncHTTPClient
public import Foundation
import NIOCore
import NIOHTTP1
import OrchardFormats
public import OrchardHTTPClient
public import OrchardProtocol
import OrchardSupport

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

/// The coordinator's admin API (`/v1/admin/processes…`, and `/metrics`) over AsyncHTTPClient, with `Authorization:
/// Bearer <admin token>`: the one admin client, used by `orchard process` and by the fleet simulator's external mode. Every failure is an ``OperatorError`` whose description is one line: the
/// coordinator's own `code: message`, `unauthorized` when it refuses the token, `unreachable` naming the URL when
/// it cannot be reached, `tls` when the handshake fails.
public final class AdminClient: Sendable {
    /// The coordinator's base URL.
    public let baseURL: URL
    /// How long a request may wait to connect, and for each piece of the answer.
    public let timeout: Duration
    private let adminToken: String
    private let connection: HTTPConnection

    /// The largest JSON answer read.
    static let maximumJSONBytes = 64 << 20
    /// The largest checkpoint read.
    static let maximumCheckpointBytes = Int(UInt32.max)

    /// Creates a client that trusts the CA certificates in a PEM file (alone), or the system's.
    /// - Parameters:
    ///   - server: The coordinator's base URL, `http://…` or `https://…`.
    ///   - adminToken: The admin token (see ``AdminToken``).
    ///   - caCertificateFile: A PEM file of CA certificates to trust (alone) for an `https` server.
    ///   - timeout: How long to wait to connect and for each piece of an answer.
    /// - Throws: ``OperatorError`` (`invalid_argument`, `missing_file`) for a bad URL, timeout or CA file.
    public convenience init(server: String, adminToken: String, caCertificateFile: String? = nil, timeout: Duration = .seconds(30)) throws(OperatorError) {
        var roots = TrustRoots.system
        if let caCertificateFile {
            do throws(ConnectionError) { roots = try TrustRoots.certificateFile(caCertificateFile) } catch {
                throw OperatorError(.missingFile, "--ca-cert \(error.message.replacingOccurrences(of: "CA certificate file ", with: ""))")
            }
        }
        try self.init(server: server, adminToken: adminToken, trustRoots: roots, timeout: timeout)
    }

    /// Creates a client.
    /// - Parameters:
    ///   - server: The coordinator's base URL, `http://…` or `https://…`.
    ///   - adminToken: The admin token (see ``AdminToken``).
    ///   - trustRoots: The certificate authorities trusted for an `https` server.
    ///   - timeout: How long to wait to connect and for each piece of an answer.
    /// - Throws: ``OperatorError`` (`invalid_argument`) for a bad URL, timeout or trust roots.
    public init(server: String, adminToken: String, trustRoots: TrustRoots, timeout: Duration = .seconds(30)) throws(OperatorError) {
        guard let url = HTTPConnection.baseURL(server) else {
            throw OperatorError(.invalidArgument, "--server '\(server)' is not a coordinator URL such as http://127.0.0.1:8080 or https://fl.example.com")
        }
        guard timeout > .zero else {
            throw OperatorError(.invalidArgument, "--timeout must be a positive number of seconds, not \(timeout.secondsText)")
        }
        do throws(ConnectionError) { connection = try HTTPConnection(timeout: timeout, trustRoots: trustRoots) } catch {
            throw OperatorError(.invalidArgument, "--ca-cert \(error.message.replacingOccurrences(of: "CA certificate file ", with: ""))")
        }
        baseURL = url
        self.timeout = timeout
        self.adminToken = adminToken
    }

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
        let (status, bytes, url) = try await send(
            .GET, Endpoint.checkpoint(try Self.pathComponent(processID), which.description), limit: Self.maximumCheckpointBytes)
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

    /// `PUT /v1/admin/processes/{id}/evaluation`: attaches held-out data (a file `orchard data prepare` writes); the
    /// answer holds the latest checkpoint's evaluation on it.
    public func attachEvaluationData(_ processID: String, data: [UInt8]) async throws(OperatorError) -> AdminAnswer<ProcessEvaluations> {
        try await json(.PUT, Endpoint.evaluation(try Self.pathComponent(processID)), body: data, contentType: "application/octet-stream")
    }

    /// `GET /v1/admin/processes/{id}/evaluation`: the data attached and the checkpoints evaluated on it.
    public func evaluations(_ processID: String) async throws(OperatorError) -> AdminAnswer<ProcessEvaluations> {
        try await json(.GET, Endpoint.evaluation(try Self.pathComponent(processID)))
    }

    /// `DELETE /v1/admin/processes/{id}/evaluation`: detaches the held-out data.
    public func removeEvaluationData(_ processID: String) async throws(OperatorError) {
        let (status, bytes, url) = try await send(.DELETE, Endpoint.evaluation(try Self.pathComponent(processID)), limit: Self.maximumJSONBytes)
        guard (200..<300).contains(status) else { throw serverError(status: status, bytes: bytes, url: url) }
    }

    /// `GET /metrics`: the coordinator's Prometheus text.
    public func metrics() async throws(OperatorError) -> String {
        let (status, bytes, url) = try await send(.GET, Endpoint.metrics, limit: Self.maximumJSONBytes)
        guard (200..<300).contains(status) else { throw serverError(status: status, bytes: bytes, url: url) }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Shuts the HTTP client down (otherwise done when the client is released).
    public func shutdown() async {
        try? await connection.client.shutdown()
    }

    // MARK: Plumbing

    /// A process id as one path component; ids have the shape `p_` + 16 hex digits, anything else cannot name one.
    static func pathComponent(_ processID: String) throws(OperatorError) -> String {
        guard !processID.isEmpty,
            processID.unicodeScalars.allSatisfy({ $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "_" || $0 == "-") })
        else {
            throw OperatorError(.invalidArgument, "'\(processID)' is not a process id (ids look like p_0123456789abcdef; `orchard process list` shows them)")
        }
        return processID
    }

    private func json<Answer: Decodable & Sendable>(
        _ method: HTTPMethod, _ path: String, body: [UInt8]? = nil, contentType: String = MediaType.json
    ) async throws(OperatorError) -> AdminAnswer<Answer> {
        let (status, bytes, url) = try await send(method, path, body: body, contentType: contentType, limit: Self.maximumJSONBytes)
        guard (200..<300).contains(status) else { throw serverError(status: status, bytes: bytes, url: url) }
        do {
            return AdminAnswer(value: try WireCoding.decoder().decode(Answer.self, from: Data(bytes)), json: bytes)
        } catch {
            throw OperatorError(
                .unexpectedAnswer, "the answer from \(url) is not a valid \(Answer.self); is --server an Orchard coordinator of this version?",
                httpStatus: status)
        }
    }

    private func send(
        _ method: HTTPMethod, _ path: String, body: [UInt8]? = nil, contentType: String = MediaType.json, limit: Int
    ) async throws(OperatorError) -> (Int, [UInt8], String) {
        let url: String
        do throws(ConnectionError) { url = try HTTPConnection.url(baseURL, path: path) } catch {
            throw OperatorError(.invalidArgument, error.message)
        }
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers.add(name: WireProtocol.versionHeader, value: WireProtocol.version.description)
        request.headers.add(name: "Accept", value: MediaType.json + ", " + MediaType.safetensors)
        request.headers.add(name: "Authorization", value: "Bearer \(adminToken)")
        if let body {
            request.headers.add(name: "Content-Type", value: contentType)
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        do throws(ConnectionError) {
            let answer = try await connection.send(request, limit: limit)
            return (answer.status, answer.body, url)
        } catch {
            throw Self.connectionError(error, server: baseURL.absoluteString, url: url, timeout: timeout)
        }
    }

    /// The error of a non-2xx answer: the coordinator's code and message; a refused token says so.
    func serverError(status: Int, bytes: [UInt8], url: String) -> OperatorError {
        let body = try? WireCoding.decoder().decode(ErrorBody.self, from: Data(bytes))
        if status == 401 {
            let detail = body.map { " (\($0.error.message))" } ?? ""
            return OperatorError(
                .unauthorized,
                "the admin token was refused by \(baseURL.absoluteString)\(detail); check \(AdminToken.environmentVariable) or --admin-token-file",
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

    /// A failure to talk to the coordinator at all: TLS, refused, timed out, unknown host, or an answer over the limit.
    static func connectionError(_ error: ConnectionError, server: String, url: String, timeout: Duration) -> OperatorError {
        switch error.code {
        case .tls:
            return OperatorError(
                .tls, "TLS connection to \(server) failed: \(error.message); for a coordinator whose certificate comes from a private CA, give --ca-cert FILE")
        case .answerTooLarge:
            return OperatorError(.unexpectedAnswer, "the answer from \(url) \(error.message.replacingOccurrences(of: "the answer ", with: ""))")
        case .cancelled:
            return OperatorError(.unreachable, "cancelled while talking to the coordinator at \(server)")
        default:
            let reason = error.message.contains("within the timeout") ? "no answer within \(timeout.secondsText) s" : error.message
            return OperatorError(
                .unreachable, "cannot reach the coordinator at \(server) (\(reason)); check that `orchard serve` is running there and --server is right")
        }
    }
}
