import AsyncHTTPClient
public import Crypto
public import Foundation
import NIOCore
import NIOHTTP1
public import OrchardHTTPClient
package import OrchardSupport
package import SwiftProtobuf

/// Where a SuperLink's Fleet API is and how to reach it.
public struct SuperLinkAddress: Sendable, Hashable, CustomStringConvertible {
    /// The SuperLink's host and Fleet API port, `HOST:PORT`.
    public var hostPort: String
    /// `nil` for plain HTTP (`--insecure`), otherwise the certificate authorities trusted for HTTPS.
    public var trustRoots: TrustRoots?

    /// Creates an address; `trustRoots: nil` speaks plain HTTP, as `flower-superlink --insecure` does.
    /// - Throws: ``FlowerError/Code/invalidConfiguration`` when `hostPort` is not `HOST:PORT` with a port in 1…65535.
    public init(_ hostPort: String, trustRoots: TrustRoots?) throws(FlowerError) {
        guard let colon = hostPort.lastIndex(of: ":"), colon != hostPort.startIndex,
            let port = Int(hostPort[hostPort.index(after: colon)...]), (1...65535).contains(port),
            !hostPort.contains("/"), !hostPort.contains(" ")
        else {
            throw FlowerError(.invalidConfiguration, "'\(hostPort)' is not a SuperLink address HOST:PORT, such as 127.0.0.1:9092")
        }
        self.hostPort = hostPort
        self.trustRoots = trustRoots
    }

    /// The Fleet API's base URL.
    public var baseURL: String { "\(trustRoots == nil ? "http" : "https")://\(hostPort)" }

    public var description: String { baseURL }
}

/// One call of the Fleet API: its path under `/v1/fleet/`, and its request and response messages.
package struct FleetCall<Request: SwiftProtobuf.Message, Response: SwiftProtobuf.Message>: Sendable {
    /// The path, e.g. `/v1/fleet/pull-messages`.
    package let path: String

    package static var registerNode: FleetCall<Flwr_Proto_RegisterNodeFleetRequest, Flwr_Proto_RegisterNodeFleetResponse> { .init(path: "register-node") }
    package static var activateNode: FleetCall<Flwr_Proto_ActivateNodeRequest, Flwr_Proto_ActivateNodeResponse> { .init(path: "activate-node") }
    package static var deactivateNode: FleetCall<Flwr_Proto_DeactivateNodeRequest, Flwr_Proto_DeactivateNodeResponse> { .init(path: "deactivate-node") }
    package static var unregisterNode: FleetCall<Flwr_Proto_UnregisterNodeFleetRequest, Flwr_Proto_UnregisterNodeFleetResponse> {
        .init(path: "unregister-node")
    }
    package static var heartbeat: FleetCall<Flwr_Proto_SendNodeHeartbeatRequest, Flwr_Proto_SendNodeHeartbeatResponse> { .init(path: "send-node-heartbeat") }
    package static var pullMessages: FleetCall<Flwr_Proto_PullMessagesRequest, Flwr_Proto_PullMessagesResponse> { .init(path: "pull-messages") }
    package static var pushMessages: FleetCall<Flwr_Proto_PushMessagesRequest, Flwr_Proto_PushMessagesResponse> { .init(path: "push-messages") }
    package static var pullObject: FleetCall<Flwr_Proto_PullObjectRequest, Flwr_Proto_PullObjectResponse> { .init(path: "pull-object") }
    package static var pushObject: FleetCall<Flwr_Proto_PushObjectRequest, Flwr_Proto_PushObjectResponse> { .init(path: "push-object") }
    package static var confirmReceived: FleetCall<Flwr_Proto_ConfirmMessageReceivedRequest, Flwr_Proto_ConfirmMessageReceivedResponse> {
        .init(path: "confirm-message-received")
    }

    private init(path: String) { self.path = "/v1/fleet/" + path }
}

/// The SuperNode's identity: a P-384 key pair whose public half (PEM SubjectPublicKeyInfo) names the node to the
/// SuperLink, and which signs every Fleet request's timestamp.
public struct NodeIdentity: Sendable {
    /// The private signing key.
    public let privateKey: P384.Signing.PrivateKey

    /// A fresh identity, or the one whose raw private key was saved.
    public init(privateKey: P384.Signing.PrivateKey = P384.Signing.PrivateKey()) { self.privateKey = privateKey }

    /// The public key as the SuperLink reads it: PEM SubjectPublicKeyInfo, as Flower's SuperNode sends it.
    public var publicKeyPEM: Data { Data((privateKey.publicKey.pemRepresentation + "\n").utf8) }

    /// The three headers that authenticate a Fleet request signed at `date`.
    func headers(at date: Date) throws(FlowerError) -> [(String, String)] {
        let timestamp = Self.timestamp(date)
        let signature: P384.Signing.ECDSASignature
        do {
            // ECDSA over SHA-256, as Flower signs (P-384 would default to SHA-384).
            signature = try privateKey.signature(for: SHA256.hash(data: Data(timestamp.utf8)))
        } catch {
            throw FlowerError(.invalidConfiguration, "cannot sign the request with the node's key: \(error)")
        }
        return [
            ("flwr-public-key", publicKeyPEM.base64EncodedString()),
            ("flwr-timestamp", timestamp),
            ("flwr-signature", signature.derRepresentation.base64EncodedString()),
        ]
    }

    /// ISO 8601 in UTC with microseconds and `+00:00`, as Python's `datetime.isoformat()` writes it.
    static func timestamp(_ date: Date) -> String {
        let micros = Int64((date.timeIntervalSince1970 * 1_000_000).rounded(.down))
        let seconds = micros.quotient(dividingBy: 1_000_000)
        let fraction = micros - seconds * 1_000_000
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let parts = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: Date(timeIntervalSince1970: Double(seconds)))
        func pad(_ value: Int?, _ width: Int) -> String {
            let text = String(value ?? 0)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(parts.year, 4))-\(pad(parts.month, 2))-\(pad(parts.day, 2))T\(pad(parts.hour, 2)):\(pad(parts.minute, 2)):\(pad(parts.second, 2))"
            + ".\(pad(Int(fraction), 6))+00:00"
    }
}

extension Int64 {
    /// Floor division (the quotient rounded towards negative infinity).
    fileprivate func quotient(dividingBy divisor: Int64) -> Int64 {
        let (q, r) = quotientAndRemainder(dividingBy: divisor)
        return r < 0 ? q - 1 : q
    }
}

/// The Fleet API as a SuperNode calls it: protobuf bodies over HTTP POST, each request signed by the node's
/// identity and carrying Flower's runtime-version headers.
package struct FleetClient: Sendable {
    /// The SuperLink.
    package let address: SuperLinkAddress
    private let identity: NodeIdentity
    private let clock: any WallClock
    private let connection: HTTPConnection

    /// The largest answer read: a pulled object is at most a 5 MiB array chunk plus its header.
    static let maximumAnswerBytes = 64 << 20

    /// The flwr release whose Fleet API this client speaks (sent as Flower's runtime-version headers).
    package static let flowerVersion = "1.41.0"

    /// Creates a client; `timeout` bounds connecting and each wait for data.
    package init(address: SuperLinkAddress, identity: NodeIdentity, timeout: Duration = .seconds(30), clock: any WallClock = SystemClock()) throws(FlowerError)
    {
        self.address = address
        self.identity = identity
        self.clock = clock
        do throws(ConnectionError) {
            connection = try HTTPConnection(timeout: max(timeout, .milliseconds(1)), trustRoots: address.trustRoots ?? .system)
        } catch {
            throw FlowerError(.invalidConfiguration, error.message)
        }
    }

    /// Sends `request` to `call`'s path and decodes its answer.
    /// - Throws: ``FlowerError`` `.unauthorized` (401), `.superlinkRefused` (another non-2xx, with the SuperLink's
    ///   detail), `.superlinkUnreachable` (connection, TLS), `.invalidAnswer` (not the expected protobuf message),
    ///   `.cancelled`.
    package func send<Request, Response>(_ call: FleetCall<Request, Response>, _ request: Request) async throws(FlowerError) -> Response {
        let url = address.baseURL + call.path
        var http = HTTPClientRequest(url: url)
        http.method = .POST
        http.headers.add(name: "Content-Type", value: "application/protobuf")
        http.headers.add(name: "Accept", value: "application/protobuf")
        http.headers.add(name: "flwr-package-name", value: "flwr")
        http.headers.add(name: "flwr-package-version", value: Self.flowerVersion)
        http.headers.add(name: "flwr-component-name", value: "SuperNode")
        for (name, value) in try identity.headers(at: clock.date) { http.headers.add(name: name, value: value) }
        let body: [UInt8]
        do {
            body = try request.serializedBytes(options: Self.deterministic)
        } catch {
            throw FlowerError(.invalidConfiguration, "cannot encode \(Request.protoMessageName): \(error)")
        }
        http.body = .bytes(ByteBuffer(bytes: body))
        let status: Int
        let bytes: [UInt8]
        do throws(ConnectionError) {
            (status, _, bytes) = try await connection.send(http, limit: Self.maximumAnswerBytes)
        } catch {
            switch error.code {
            case .answerTooLarge: throw FlowerError(.invalidAnswer, "the answer to \(call.path) exceeds \(Self.maximumAnswerBytes) bytes")
            case .cancelled: throw FlowerError(.cancelled, "cancelled")
            case .tls:
                throw FlowerError(
                    .superlinkUnreachable,
                    "SuperLink at \(address): TLS connection to \(url) failed: \(error.message); if the SuperLink's certificate comes from a private CA, trust it (--ca-cert)"
                )
            default: throw FlowerError(.superlinkUnreachable, "SuperLink at \(address): request to \(url) failed: \(error.message)")
            }
        }
        guard (200..<300).contains(status) else {
            let detail = Self.detail(bytes)
            if status == 401 {
                throw FlowerError(
                    .unauthorized, "the SuperLink refused the node's signature or identity on \(call.path) (401\(detail.map { ": \($0)" } ?? ""))")
            }
            throw FlowerError(
                .superlinkRefused, "\(call.path) answered HTTP \(status)\(detail.map { ": \($0)" } ?? "")", httpStatus: status, apiCode: Self.apiCode(bytes)
            )
        }
        do {
            return try Response(serializedBytes: bytes)
        } catch {
            throw FlowerError(.invalidAnswer, "the answer to \(call.path) is not a \(Response.protoMessageName) (\(bytes.count) bytes): \(error)")
        }
    }

    /// Serialisation with map keys sorted, as flwr's `SerializeToString(deterministic=True)`.
    static let deterministic: BinaryEncodingOptions = {
        var options = BinaryEncodingOptions()
        options.useDeterministicOrdering = true
        return options
    }()

    /// The readable part of an error answer: FastAPI's `{"detail": …}` or Flower's `{"code", "message"}`, else
    /// the first 200 characters of a text body.
    static func detail(_ bytes: [UInt8]) -> String? {
        guard !bytes.isEmpty else { return nil }
        if let object = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any] {
            if let detail = object["detail"] { return "\(detail)" }
            if let message = object["message"] as? String { return object["code"].map { "[\($0)] \(message)" } ?? message }
        }
        guard let text = String(bytes: bytes.prefix(200), encoding: .utf8) else { return nil }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Flower's `ApiErrorCode` in an error answer `{"code": N, "detail": …}`.
    static func apiCode(_ bytes: [UInt8]) -> Int? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any] else { return nil }
        return (object["code"] as? NSNumber)?.intValue
    }
}
