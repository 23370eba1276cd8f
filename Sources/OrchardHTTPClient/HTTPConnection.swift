package import AsyncHTTPClient
package import Foundation
import NIOCore
package import NIOHTTP1
import NIOSSL
import OrchardSupport

/// The AsyncHTTPClient plumbing every Orchard HTTP client shares (the device transport, the Flower node's Fleet
/// client, the operator's admin client): one client per connection with the trust roots, a timeout for connecting and
/// for each wait for data, no redirects, no silent reconnection, answers read up to a limit, and failures sorted into
/// cancelled, TLS and network with a reason in a few words. The HTTP client is shut down when the last reference goes.
package final class HTTPConnection: Sendable {
    /// The underlying client (for streaming a body as it arrives).
    package let client: HTTPClient
    /// How long to wait to connect, and for each piece of an answer.
    package let timeout: Duration

    /// Creates a connection.
    /// - Throws: ``ConnectionError/Code/invalidConfiguration`` for a timeout that is not positive or trust roots that
    ///   are not PEM certificates.
    package init(timeout: Duration, trustRoots: TrustRoots = .system) throws(ConnectionError) {
        guard timeout > .zero else {
            throw ConnectionError(.invalidConfiguration, "timeout must be positive, not \(timeout)")
        }
        self.timeout = timeout
        let wait = TimeAmount.nanoseconds(min(timeout, .seconds(86_400)).inNanoseconds)
        var pool = HTTPClient.Configuration.ConnectionPool()
        // A failed connection (refused, TLS handshake) fails the call at once; the caller's retry policy decides
        // whether to try again.
        pool.retryConnectionEstablishment = false
        let configuration = HTTPClient.Configuration(
            tlsConfiguration: try trustRoots.tlsConfiguration(), redirectConfiguration: .disallow,
            timeout: HTTPClient.Configuration.Timeout(connect: wait, read: wait), connectionPool: pool
        )
        client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    }

    deinit { client.shutdown { _ in } }

    /// An absolute `http(s)` URL with a host, or nil.
    package static func baseURL(_ text: String) -> URL? {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = url.host, !host.isEmpty
        else { return nil }
        return url
    }

    /// `path` (and `query`, sorted by name) under `base`'s own path.
    /// - Throws: ``ConnectionError/Code/invalidConfiguration`` when no URL can be built.
    package static func url(_ base: URL, path: String, query: [String: String] = [:]) throws(ConnectionError) -> String {
        guard var components = URLComponents(url: base, resolvingAgainstBaseURL: false) else {
            throw ConnectionError(.invalidConfiguration, "cannot build a request URL from \(base)")
        }
        let prefix = components.path.hasSuffix("/") ? String(components.path.dropLast()) : components.path
        components.path = prefix + path
        components.queryItems = query.isEmpty ? nil : query.sorted { $0.key < $1.key }.map { URLQueryItem(name: $0.key, value: $0.value) }
        guard let url = components.url else {
            throw ConnectionError(.invalidConfiguration, "cannot build a request URL for \(path) from \(base)")
        }
        return url.absoluteString
    }

    /// Sends `request` and returns the answer's head, its body left to stream.
    /// - Throws: ``ConnectionError`` (cancelled, TLS, network).
    package func execute(_ request: HTTPClientRequest) async throws(ConnectionError) -> HTTPClientResponse {
        do {
            return try await client.execute(request, deadline: .distantFuture)
        } catch {
            throw Self.failure(error)
        }
    }

    /// Sends `request` and reads the whole answer, up to `limit` bytes.
    /// - Throws: ``ConnectionError`` (cancelled, TLS, network, `answer_too_large`).
    package func send(_ request: HTTPClientRequest, limit: Int) async throws(ConnectionError) -> (status: Int, headers: HTTPHeaders, body: [UInt8]) {
        let response = try await execute(request)
        return (Int(response.status.code), response.headers, try await Self.collect(response.body, limit: limit))
    }

    /// Reads a whole body, up to `limit` bytes.
    /// - Throws: ``ConnectionError`` (`answer_too_large` past the limit, or the connection's failure).
    package static func collect(_ body: HTTPClientResponse.Body, limit: Int) async throws(ConnectionError) -> [UInt8] {
        do {
            var buffer = try await body.collect(upTo: limit)
            return buffer.readBytes(length: buffer.readableBytes) ?? []
        } catch is NIOTooManyBytesError {
            throw ConnectionError(.answerTooLarge, "the answer exceeds \(limit) bytes")
        } catch {
            throw failure(error)
        }
    }

    /// Sorts any failure of AsyncHTTPClient: cancellation, a TLS failure (not worth retrying: the certificate will
    /// not change by itself), or a network failure, each with a reason in a few words.
    package static func failure(_ error: any Error) -> ConnectionError {
        if let error = error as? ConnectionError { return error }
        if error is CancellationError || Task.isCancelled { return ConnectionError(.cancelled, "cancelled") }
        if let client = error as? HTTPClientError, client == .cancelled { return ConnectionError(.cancelled, "cancelled") }
        if let tls = tlsFailure(error) { return ConnectionError(.tls, tls) }
        return ConnectionError(.network, networkReason(error))
    }

    /// A connection failure in a few words: NIO's own descriptions nest the OS error in parentheses of their own
    /// (`connection reset (error set): Connection refused) (errno: 111)`), which is no sentence to show anyone.
    package static func networkReason(_ error: any Error) -> String {
        if let client = error as? HTTPClientError {
            switch client {
            case .connectTimeout: return "no connection within the timeout"
            case .readTimeout, .deadlineExceeded: return "no answer within the timeout"
            case .remoteConnectionClosed: return "the peer closed the connection"
            default: break
            }
        }
        let text = String(describing: error).split(whereSeparator: \.isNewline).joined(separator: " ")
        let lowered = text.lowercased()
        if lowered.contains("refused") { return "connection refused" }
        if ["unknownhost", "unknown host", "name or service not known", "nodename nor servname", "nxdomain", "resolve"].contains(where: lowered.contains) {
            return "the host name cannot be resolved"
        }
        if lowered.contains("reset") { return "the connection was reset" }
        if lowered.contains("timed out") || lowered.contains("timeout") { return "the connection timed out" }
        return text
    }

    /// The reason of a TLS failure, or nil for any other error.
    static func tlsFailure(_ error: any Error) -> String? {
        if let error = error as? NIOSSLError {
            switch error {
            case .handshakeFailed(let reasons):
                let text = "\(reasons)"
                return text.contains("CERTIFICATE_VERIFY_FAILED") ? "the server's certificate is not trusted (\(text))" : "the handshake failed (\(text))"
            case .unableToValidateCertificate: return "the server's certificate cannot be validated"
            default: return "\(error)"
            }
        }
        if let error = error as? NIOSSLExtraError, error == .failedToValidateHostname { return "the server's certificate is not for this host" }
        if let error = error as? BoringSSLError { return "\(error)" }
        return nil
    }
}
