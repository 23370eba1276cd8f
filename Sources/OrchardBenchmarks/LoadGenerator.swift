import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import OrchardProtocol

/// Sends the setup requests of the coordinator benchmark (hosting, authentication, model download) through
/// AsyncHTTPClient and checks their status; the timed requests go through ``BenchConnection``s.
struct LoadGenerator: Sendable {
    let client: HTTPClient
    let port: Int
    let adminToken: String

    var base: String { "http://127.0.0.1:\(port)" }

    /// A request head for a ``BenchConnection``.
    /// A request head without credentials or body.
    func head(_ method: HTTPMethod, _ path: String) -> HTTPRequestHead {
        Self.head(method, path, port: port)
    }

    /// A request head for `path` on the loopback server at `port`.
    static func head(_ method: HTTPMethod, _ path: String, port: Int) -> HTTPRequestHead {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: path)
        head.headers.add(name: "Host", value: "127.0.0.1:\(port)")
        return head
    }

    func head(_ method: HTTPMethod, _ path: String, session: String, contentType: String) -> HTTPRequestHead {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: path)
        head.headers.add(name: "Host", value: "127.0.0.1:\(port)")
        head.headers.add(name: "Authorization", value: "Bearer \(session)")
        head.headers.add(name: "Content-Type", value: contentType)
        return head
    }

    /// Sends `json` as the body and returns the response body; a status outside 2xx throws.
    func send(_ method: HTTPMethod, _ path: String, json: some Encodable, session: String? = nil, admin: Bool = false) async throws -> [UInt8] {
        try await send(method, path, body: Array(try WireCoding.encoder().encode(json)), contentType: MediaType.json, session: session, admin: admin)
    }

    /// Sends a request and returns the response body; a status outside 2xx throws.
    func send(
        _ method: HTTPMethod, _ path: String, body: [UInt8]? = nil, contentType: String = MediaType.safetensors, session: String? = nil,
        admin: Bool = false
    ) async throws -> [UInt8] {
        var request = HTTPClientRequest(url: base + path)
        request.method = method
        if let body {
            request.headers.add(name: "Content-Type", value: contentType)
            request.body = .bytes(body)
        }
        if let session { request.headers.add(name: "Authorization", value: "Bearer \(session)") }
        if admin { request.headers.add(name: "Authorization", value: "Bearer \(adminToken)") }
        let response = try await client.execute(request, timeout: .seconds(120))
        let buffer = try await response.body.collect(upTo: 1 << 30)
        let bytes = Array(buffer.readableBytesView)
        guard (200..<300).contains(Int(response.status.code)) else {
            let name = "\(method) \(path)"
            throw BenchmarkError(
                .unexpectedResponse, "\(name): HTTP \(response.status.code) \(String(decoding: bytes, as: UTF8.self))",
                context: ["request": name, "status": "\(response.status.code)"]
            )
        }
        return bytes
    }

    /// Decodes a wire-format JSON body.
    func decode<T: Decodable>(_ type: T.Type, _ bytes: [UInt8]) throws -> T {
        try WireCoding.decoder().decode(T.self, from: Data(bytes))
    }
}
