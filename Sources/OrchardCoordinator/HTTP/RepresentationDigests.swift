import Crypto
import Foundation
import HTTPTypes
import Synchronization

/// The SHA-256 of served models (RFC 9530 `Repr-Digest` over HTTP, `sha-256=:<base64>:`, over the whole
/// representation, also on 206), computed once per entity tag: a model's bytes never change under its tag.
public final class RepresentationDigests: Sendable {
    static let field = HTTPField.Name("Repr-Digest")!
    /// Tags remembered; models of a few recent checkpoints are served at once.
    private static let capacity = 8
    private let values = Mutex<[(etag: String, digest: [UInt8])]>([])

    /// An empty cache.
    public init() {}

    /// The SHA-256 of `bytes`, the representation tagged `etag`.
    public func sha256(of bytes: [UInt8], etag: String) -> [UInt8] {
        if let known = values.withLock({ $0.first { $0.etag == etag }?.digest }) { return known }
        let digest = Array(SHA256.hash(data: bytes))
        values.withLock { entries in
            entries.removeAll { $0.etag == etag }
            entries.append((etag, digest))
            if entries.count > Self.capacity { entries.removeFirst() }
        }
        return digest
    }

    /// The `Repr-Digest` field value for `bytes`, the representation tagged `etag`.
    func value(of bytes: [UInt8], etag: String) -> String {
        "sha-256=:\(Data(sha256(of: bytes, etag: etag)).base64EncodedString()):"
    }
}
