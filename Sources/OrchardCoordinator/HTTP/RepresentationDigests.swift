import Crypto
import Foundation
import HTTPTypes
import Synchronization

/// The RFC 9530 `Repr-Digest` of served models (`sha-256=:<base64>:`, over the whole representation, also on
/// 206), computed once per entity tag: a model's bytes never change under its tag.
final class RepresentationDigests: Sendable {
    static let field = HTTPField.Name("Repr-Digest")!
    /// Tags remembered; models of a few recent checkpoints are served at once.
    private static let capacity = 8
    private let values = Mutex<[(etag: String, value: String)]>([])

    func value(of bytes: [UInt8], etag: String) -> String {
        if let known = values.withLock({ $0.first { $0.etag == etag }?.value }) { return known }
        let value = "sha-256=:\(Data(SHA256.hash(data: bytes)).base64EncodedString()):"
        values.withLock { entries in
            entries.removeAll { $0.etag == etag }
            entries.append((etag, value))
            if entries.count > Self.capacity { entries.removeFirst() }
        }
        return value
    }
}
