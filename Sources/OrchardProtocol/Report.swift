public import OrchardFormats
public import Foundation

/// What a device says about its report, besides the diff itself.
public struct ReportMetadata: Sendable, Hashable, Codable {
    /// The worker id.
    public var workerID: String
    /// The request key from the cycle assignment.
    public var requestKey: String
    /// Samples the device trained on; the diff's weight in the average.
    public var sampleCount: Int
    /// Training metrics such as `loss` (informational).
    public var metrics: [String: Double]
    /// The checkpoint the device trained from (protocol 2.6; a buffered process weighs the report by how many
    /// checkpoints were published since, and needs it).
    public var checkpoint: Int?

    enum CodingKeys: String, CodingKey {
        case workerID = "worker_id"
        case requestKey = "request_key"
        case sampleCount = "sample_count"
        case metrics, checkpoint
    }

    /// Creates metadata.
    public init(workerID: String, requestKey: String, sampleCount: Int, metrics: [String: Double] = [:], checkpoint: Int? = nil) {
        self.checkpoint = checkpoint
        self.workerID = workerID
        self.requestKey = requestKey
        self.sampleCount = sampleCount
        self.metrics = metrics
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        workerID = try c.decode(String.self, forKey: .workerID)
        requestKey = try c.decode(String.self, forKey: .requestKey)
        sampleCount = try c.decode(Int.self, forKey: .sampleCount)
        metrics = try c.decodeIfPresent([String: Double].self, forKey: .metrics) ?? [:]
        checkpoint = try c.decodeIfPresent(Int.self, forKey: .checkpoint)
    }
}

/// A report on the wire: one safetensors file whose tensors are the diff (`trained − received`, same names and
/// shapes as the model's weights, F32) and whose `__metadata__["orchard.report"]` holds ``ReportMetadata`` as
/// JSON.
public enum ReportEnvelope {
    /// The metadata key holding the report's JSON.
    public static let metadataKey = "orchard.report"

    /// Encodes a diff and its metadata as one safetensors body.
    public static func encode(diff: [TensorRecord], metadata: ReportMetadata) -> [UInt8] {
        Safetensors.encode(diff, metadata: [metadataKey: json(metadata)])
    }

    /// The header part of ``encode(diff:metadata:)``; the body is this followed by the diff's values as
    /// little-endian Float32, tensors in name order (see `Safetensors.encodeHeader`).
    public static func encodeHeader(diff: [TensorRecord], metadata: ReportMetadata) -> [UInt8] {
        Safetensors.encodeHeader(diff, metadata: [metadataKey: json(metadata)])
    }

    private static func json(_ metadata: ReportMetadata) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        // Encoding a struct of strings, an integer and finite doubles cannot fail; non-finite metrics are dropped.
        var clean = metadata
        clean.metrics = metadata.metrics.filter { $0.value.isFinite }
        return (try? encoder.encode(clean)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    /// Reads the metadata of a decoded report.
    /// - Throws: `FormatError(.invalidHeader)` when the key is absent or its JSON is not ``ReportMetadata``.
    public static func metadata(of archive: SafetensorsArchive) throws(FormatError) -> ReportMetadata {
        try metadata(in: archive.metadata)
    }

    /// Reads the report metadata from a safetensors file's `__metadata__` pairs.
    /// - Throws: `FormatError(.invalidHeader)` when the key is absent or its JSON is not ``ReportMetadata``.
    public static func metadata(in pairs: [String: String]) throws(FormatError) -> ReportMetadata {
        guard let json = pairs[metadataKey] else {
            throw FormatError(.invalidHeader, "report has no __metadata__[\"\(metadataKey)\"]")
        }
        do {
            return try JSONDecoder().decode(ReportMetadata.self, from: Data(json.utf8))
        } catch {
            throw FormatError(.invalidHeader, "__metadata__[\"\(metadataKey)\"] is not report metadata: \(error)")
        }
    }
}

/// The JSON coders for wire messages (every message fixes its own keys, so any coder works; these sort keys
/// for stable output).
public enum WireCoding {
    /// A JSON encoder with sorted keys.
    public static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    /// A JSON decoder.
    public static func decoder() -> JSONDecoder { JSONDecoder() }

    /// A JSON decoder that refuses unknown keys where a message supports it (``HostProcessRequest`` and the server
    /// configuration; see ``CodingUserInfoKey/orchardRejectUnknownKeys``).
    public static func strictDecoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.userInfo[.orchardRejectUnknownKeys] = true
        return decoder
    }
}
