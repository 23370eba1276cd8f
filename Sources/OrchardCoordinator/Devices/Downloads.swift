import Foundation
import OrchardProtocol

/// Which bytes of an immutable download (a model, a checkpoint) to send, by RFC 9110's rules for `If-None-Match`,
/// `If-Range` and a single `Range`: shared by the HTTP API and the in-process transport, so a device resumes the
/// same way over both.
public enum DownloadSelection: Sendable, Hashable {
    /// The caller holds this entity already (`If-None-Match` matched).
    case notModified
    /// Every byte: no range asked, or the held bytes are of another entity (`If-Range` did not match).
    case whole
    /// The bytes of one satisfiable range.
    case partial(Range<Int>)

    /// Selects what to send of `total` bytes tagged `etag`.
    /// - Parameters:
    ///   - total: The entity's size in bytes.
    ///   - etag: The entity's tag.
    ///   - range: The requested range (`bytes=a-b`, `bytes=a-`, `bytes=-n`), if any.
    ///   - ifRange: The entity tag the requested range belongs to, if given.
    ///   - ifNoneMatch: Entity tags the caller holds (comma-separated, or `*`), if given.
    /// - Throws: `range_not_satisfiable` when the range is malformed, multi-part or past the end.
    public static func select(total: Int, etag: String, range: String?, ifRange: String?, ifNoneMatch: String?) throws(CoordinatorError) -> DownloadSelection {
        if let ifNoneMatch,
            ifNoneMatch.split(separator: ",").contains(where: {
                let tag = $0.trimmingCharacters(in: .whitespaces)
                return tag == etag || tag == "*"
            })
        {
            return .notModified
        }
        guard let range else { return .whole }
        if let ifRange, ifRange != etag { return .whole }
        guard let satisfiable = ByteRange.parse(range, total: total) else {
            throw CoordinatorError(.rangeNotSatisfiable, "range '\(range)' cannot be served from \(total) bytes")
        }
        return .partial(satisfiable)
    }
}

/// One `bytes=` range of an HTTP Range header, resolved against a length (RFC 9110 §14.1.2).
struct ByteRange {
    /// Parses `bytes=a-b`, `bytes=a-` or `bytes=-n`; nil when unsatisfiable, malformed or multi-range.
    static func parse(_ header: String, total: Int) -> Range<Int>? {
        guard header.hasPrefix("bytes="), total > 0 else { return nil }
        let spec = header.dropFirst(6)
        guard !spec.contains(","), let dash = spec.firstIndex(of: "-") else { return nil }
        let first = spec[..<dash].trimmingCharacters(in: .whitespaces)
        let last = spec[spec.index(after: dash)...].trimmingCharacters(in: .whitespaces)
        if first.isEmpty {
            guard let suffix = Int(last), suffix > 0 else { return nil }
            return max(0, total - suffix)..<total
        }
        guard let start = Int(first), start >= 0, start < total else { return nil }
        if last.isEmpty { return start..<total }
        guard let end = Int(last), end >= start else { return nil }
        return start..<(min(end, total - 1) + 1)
    }
}
