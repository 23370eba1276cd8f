/// A dotted version number where missing trailing components are zero, so "1.0" and "1.0.0" name the same
/// version. Used for the wire protocol and for FL process versions.
public struct SemanticVersion: Sendable, Hashable, Comparable, Codable, CustomStringConvertible {
    /// The numeric components, with trailing zeros removed (so equality ignores them).
    public let components: [Int]

    /// Parses a version such as "1", "1.0" or "1.0.0"; returns nil for anything else (empty parts, signs,
    /// letters, more than four components).
    public init?(_ string: String) {
        // Read on the UTF-8 bytes (a device's check-in carries one): up to four dot-separated runs of 1–9 ASCII digits.
        var values: [Int] = []
        values.reserveCapacity(4)
        var value = 0
        var digits = 0
        for byte in string.utf8 {
            if byte == UInt8(ascii: ".") {
                guard digits > 0, values.count < 3 else { return nil }
                values.append(value)
                value = 0
                digits = 0
            } else if byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") {
                guard digits < 9 else { return nil }
                value = value * 10 + Int(byte - UInt8(ascii: "0"))
                digits += 1
            } else {
                return nil
            }
        }
        guard digits > 0 else { return nil }
        values.append(value)
        self.init(components: values)
    }

    /// Creates a version from its components.
    public init(components: [Int]) {
        var trimmed = components
        while trimmed.count > 1, trimmed.last == 0 { trimmed.removeLast() }
        self.components = trimmed
    }

    /// Creates a `major.minor.patch` version.
    public init(_ major: Int, _ minor: Int = 0, _ patch: Int = 0) {
        self.init(components: [major, minor, patch])
    }

    /// The first component.
    public var major: Int { components.first ?? 0 }
    /// The second component (0 when absent).
    public var minor: Int { components.count > 1 ? components[1] : 0 }

    /// The canonical `major.minor.patch` spelling (more components are kept when present).
    public var description: String {
        var padded = components
        while padded.count < 3 { padded.append(0) }
        return padded.map(String.init).joined(separator: ".")
    }

    public static func < (lhs: SemanticVersion, rhs: SemanticVersion) -> Bool {
        let n = max(lhs.components.count, rhs.components.count)
        for i in 0..<n {
            let a = i < lhs.components.count ? lhs.components[i] : 0
            let b = i < rhs.components.count ? rhs.components[i] : 0
            if a != b { return a < b }
        }
        return false
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let string = try container.decode(String.self)
        guard let version = SemanticVersion(string) else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "'\(string)' is not a version such as 1.0 or 1.0.0")
        }
        self = version
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}

/// The version of the wire protocol and the rule for which peers can talk to each other.
public enum WireProtocol {
    /// The protocol version this build speaks. 2.0: the client config travels only in the plan (no longer in the
    /// assignment), sessions are bound to the process they were issued for, and a report's answer says whether
    /// it closed the cycle; a 1.x device is refused at authentication (`unsupported_version`) rather than failing
    /// to decode an assignment. 2.1 (additive): the authenticate answer announces the speed-test sizes
    /// (`speed_test_download_bytes`, `speed_test_upload_bytes`), the speed test takes the device's session, and
    /// rate-limited calls answer 429 `rate_limited` with `Retry-After`. 2.2 (additive): `server_config.privacy`,
    /// the plan's `local_privacy` and the status's `privacy`. 2.3 (additive): `server_config.secure_aggregation`, the
    /// plan's `secure_aggregation`, the secure-aggregation endpoint and the cycle status's `secure_aggregation`.
    /// 2.4 (additive): the secure-aggregation endpoint also takes a masked input as a safetensors body
    /// (``MaskedInputEnvelope``), offered by the reply's `masked_input_format`. 2.5 (additive): federated evaluation —
    /// the cycle request's `tasks`, the `evaluate` answer, the evaluation-report endpoint, `client_config.holdout_fraction`,
    /// `server_config.evaluation` and the status's `federated_evaluation`. 2.6 (additive): buffered asynchronous
    /// aggregation — `server_config.aggregation_mode` and `buffered`, the report's `checkpoint`, the `report_too_stale`
    /// code and the status's `buffered`. 2.7 (additive): an evaluation report's `positions`, which a model with a
    /// sequence output needs to weigh accuracy and perplexity per position.
    public static let version = SemanticVersion(2, 7, 0)
    /// The first version whose devices apply a plan's `local_privacy`; older ones are refused by local-DP processes.
    public static let localPrivacyVersion = SemanticVersion(2, 2, 0)
    /// The first version whose devices take part in secure aggregation (older ones would upload plain reports).
    public static let secureAggregationVersion = SemanticVersion(2, 3, 0)
    /// The first version whose devices sign their secure-aggregation steps (`consistency_check`); an older one would
    /// advertise unsigned keys and be refused at every cycle.
    public static let signedSecureAggregationVersion = SemanticVersion(2, 4, 0)
    /// The first version whose devices take evaluation tasks (``CycleRequest/tasks``, ``CycleResponse/evaluate(_:)``).
    public static let evaluationVersion = SemanticVersion(2, 5, 0)
    /// The first version whose devices say which checkpoint they trained from (``ReportMetadata/checkpoint``), which a
    /// buffered process needs to weigh a report; older ones are refused by buffered processes.
    public static let bufferedAggregationVersion = SemanticVersion(2, 6, 0)
    /// The first version whose devices send an evaluation report's ``EvaluationReport/positions``; an older device's
    /// result for a model with a sequence output is refused.
    public static let evaluationPositionsVersion = SemanticVersion(2, 7, 0)
    /// The HTTP header carrying the sender's protocol version.
    public static let versionHeader = "Orchard-Protocol-Version"
    /// The path prefix of every versioned endpoint.
    public static let pathPrefix = "/v1"

    /// Whether a peer speaking `peer` can talk to this build: same major version (minor versions only add
    /// optional fields, which decoders ignore).
    public static func isCompatible(_ peer: SemanticVersion) -> Bool {
        peer.major == version.major
    }
}
