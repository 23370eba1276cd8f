import Foundation

/// How a process turns reports into checkpoints (`server_config.aggregation_mode`).
///
/// - `synchronous` (the default): cycles. A cycle admits up to goal × over-selection devices, closes at its goal or its
///   deadline, and publishes the weighted mean of its reports.
/// - `buffered`: asynchronous buffered aggregation (FedBuff, Nguyen et al. 2022). Devices check in whenever their
///   window opens and fewer than `max_concurrency` are training; each report is folded into a buffer weighted by its
///   staleness, and the buffer is published when it holds `buffer_size` reports (``BufferedAggregationConfig``).
public struct AggregationMode: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Value: String, Sendable, Hashable {
        case synchronous, buffered
    }
    private let value: Value
    private init(_ value: Value) { self.value = value }

    /// Synchronous cycles.
    public static let synchronous = AggregationMode(.synchronous)
    /// Asynchronous buffered aggregation.
    public static let buffered = AggregationMode(.buffered)

    public var description: String { value.rawValue }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let raw = try container.decode(String.self)
        guard let value = Value(rawValue: raw) else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "aggregation_mode '\(raw)' is not one of synchronous, buffered")
        }
        self.value = value
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(value.rawValue)
    }
}

/// The knobs of buffered asynchronous aggregation (`server_config.buffered`, with `aggregation_mode: "buffered"`).
///
/// A device that trained from checkpoint `c` and reports while checkpoint `t` is published has staleness `s = t − c`;
/// its update is folded with weight `sample_count × (1 + s)^(−staleness_exponent)` over a denominator of
/// `sample_count`, so a stale update moves the model less (FedBuff's `1/√(1+s)` at the default exponent 0.5). A
/// release publishes the buffer's weighted mean through the server optimizer, like a cycle's.
public struct BufferedAggregationConfig: Sendable, Hashable, Codable {
    /// Reports per published checkpoint (K).
    public var bufferSize: Int
    /// Devices admitted and not yet reported at once, across releases.
    public var maxConcurrency: Int
    /// The exponent `a` of the staleness weight `(1 + s)^(−a)`; 0 weighs every report alike.
    public var stalenessExponent: Double
    /// The largest staleness a report may have; a staler one is refused with `report_too_stale`.
    public var maxStaleness: Int

    enum CodingKeys: String, CodingKey, CaseIterable {
        case bufferSize = "buffer_size"
        case maxConcurrency = "max_concurrency"
        case stalenessExponent = "staleness_exponent"
        case maxStaleness = "max_staleness"
    }

    /// Creates a configuration; the defaults are FedBuff's (K = 10, `1/√(1+s)`).
    public init(bufferSize: Int = 10, maxConcurrency: Int = 100, stalenessExponent: Double = 0.5, maxStaleness: Int = 20) {
        self.bufferSize = bufferSize
        self.maxConcurrency = maxConcurrency
        self.stalenessExponent = stalenessExponent
        self.maxStaleness = maxStaleness
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.buffered")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = BufferedAggregationConfig()
        bufferSize = try c.decodeIfPresent(Int.self, forKey: .bufferSize) ?? d.bufferSize
        maxConcurrency = try c.decodeIfPresent(Int.self, forKey: .maxConcurrency) ?? d.maxConcurrency
        stalenessExponent = try c.decodeIfPresent(Double.self, forKey: .stalenessExponent) ?? d.stalenessExponent
        maxStaleness = try c.decodeIfPresent(Int.self, forKey: .maxStaleness) ?? d.maxStaleness
    }

    /// The weight factor of a report of staleness `s`: `(1 + s)^(−staleness_exponent)`.
    public func stalenessWeight(_ staleness: Int) -> Double {
        stalenessExponent == 0 ? 1 : pow(1 + Double(max(0, staleness)), -stalenessExponent)
    }

    /// The most devices one process may keep training at once.
    public static let maximumConcurrency = 1_000_000
    /// The largest staleness exponent.
    public static let maximumStalenessExponent: Double = 10

    /// Describes the first invalid field, or nil.
    public func validationFailure() -> String? {
        if !(1...WireLimits.maximumGoalCount).contains(bufferSize) {
            return "server_config.buffered.buffer_size must be in 1...\(WireLimits.maximumGoalCount), not \(bufferSize)"
        }
        if !(1...Self.maximumConcurrency).contains(maxConcurrency) {
            return "server_config.buffered.max_concurrency must be in 1...\(Self.maximumConcurrency), not \(maxConcurrency)"
        }
        if !(stalenessExponent >= 0 && stalenessExponent <= Self.maximumStalenessExponent) {
            return "server_config.buffered.staleness_exponent must be in [0, \(Self.maximumStalenessExponent)], not \(stalenessExponent)"
        }
        if maxStaleness < 0 { return "server_config.buffered.max_staleness must be 0 or more, not \(maxStaleness)" }
        return nil
    }
}
