import Foundation

/// The parameters of secure aggregation (Bonawitz et al. 2017; SecAgg+ of Bell et al. 2020), named after
/// Flower's SecAgg+ workflow.
///
/// Each device clips every coordinate of its update to ±``clippingRange``, rounds it stochastically to one of
/// ``quantizationRange`` levels, multiplies it by its sample count and masks the words modulo 2^``modulusBits``.
/// Secrets are shared among a device's neighbours: all other devices (``shares`` nil, SecAgg) or ``shares`` of
/// them on a random ring (SecAgg+); ``threshold`` of those neighbours must stay to unmask.
public struct SecureAggregationParameters: Sendable, Hashable, Codable {
    /// Neighbours per device (even, below the device count); nil for every other device (SecAgg).
    public var shares: Int?
    /// Shares needed to reconstruct a secret: at least 2, at most the neighbour count, above half of it.
    public var threshold: Int
    /// Each coordinate is clipped to ±clippingRange before quantisation.
    public var clippingRange: Float
    /// The number of quantisation levels Q (values 0…Q−1).
    public var quantizationRange: UInt32
    /// Arithmetic is modulo 2^modulusBits on UInt32 words (1…32).
    public var modulusBits: Int
    /// Whether the cycle runs the consistency_check round between masked_input and unmask (the actively-secure
    /// variant: signed advertisements, and devices sign the survivor set before revealing anything).
    public var consistencyCheck: Bool

    enum CodingKeys: String, CodingKey {
        case shares, threshold
        case clippingRange = "clipping_range"
        case quantizationRange = "quantization_range"
        case modulusBits = "modulus_bits"
        case consistencyCheck = "consistency_check"
    }

    /// Creates a configuration; call ``validate(devices:maximumSampleCount:)`` before use.
    public init(
        shares: Int? = nil, threshold: Int, clippingRange: Float = 8, quantizationRange: UInt32 = 1 << 16, modulusBits: Int = 32, consistencyCheck: Bool = false
    ) {
        self.shares = shares
        self.threshold = threshold
        self.clippingRange = clippingRange
        self.quantizationRange = quantizationRange
        self.modulusBits = modulusBits
        self.consistencyCheck = consistencyCheck
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        shares = try c.decodeIfPresent(Int.self, forKey: .shares)
        threshold = try c.decode(Int.self, forKey: .threshold)
        clippingRange = try c.decode(Float.self, forKey: .clippingRange)
        quantizationRange = try c.decode(UInt32.self, forKey: .quantizationRange)
        modulusBits = try c.decode(Int.self, forKey: .modulusBits)
        consistencyCheck = try c.decodeIfPresent(Bool.self, forKey: .consistencyCheck) ?? false
    }

    /// Encodes the configuration; `consistency_check` only when true, so a configuration without it encodes as before.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encodeIfPresent(shares, forKey: .shares)
        try c.encode(threshold, forKey: .threshold)
        try c.encode(clippingRange, forKey: .clippingRange)
        try c.encode(quantizationRange, forKey: .quantizationRange)
        try c.encode(modulusBits, forKey: .modulusBits)
        if consistencyCheck { try c.encode(true, forKey: .consistencyCheck) }
    }

    /// The mask selecting the low ``modulusBits`` bits of a word.
    public var modulusMask: UInt32 { modulusBits >= 32 ? .max : (UInt32(1) << UInt32(max(modulusBits, 0))) &- 1 }

    /// The width of one quantisation step, 2c / (Q − 1).
    public var quantizationStep: Double { 2 * Double(clippingRange) / Double(quantizationRange - 1) }

    /// The neighbours each of `devices` participants gets: ``shares`` capped at devices − 1 (all others when nil).
    public func neighbourCount(devices: Int) -> Int { min(shares ?? (devices - 1), max(devices - 1, 0)) }

    /// Checks the configuration for a cycle of at most `devices` devices whose sample counts are at most
    /// `maximumSampleCount`.
    /// - Throws: `invalid_configuration` naming the first problem: fewer than 3 devices; a threshold below 2, above
    ///   the neighbour count or not above half of it (an honest majority of neighbours keeps the server from
    ///   collecting both kinds of share of one device); `shares` odd, below 2 or above devices − 1; a clipping range
    ///   that is not a positive number; fewer than 2 levels; `modulus_bits` outside 1…32; a sample count below 1;
    ///   or (Q − 1) · devices · maximumSampleCount ≥ 2^modulusBits (the weighted sum could wrap).
    public func validate(devices: Int, maximumSampleCount: Int) throws(SecureAggregationError) {
        try validate(devices: devices, maximumSampleCount: maximumSampleCount, actualParticipants: false)
    }

    /// With `actualParticipants`, `devices` is the number that advertised in a cycle (possibly fewer than planned):
    /// ``shares`` is then capped at devices − 1 and the neighbour count is left to the threshold checks of the stages.
    func validate(devices: Int, maximumSampleCount: Int, actualParticipants: Bool) throws(SecureAggregationError) {
        func fail(_ message: String) -> SecureAggregationError { SecureAggregationError(.invalidConfiguration, message) }
        guard actualParticipants || devices >= 3 else { throw fail("secure aggregation needs at least 3 devices, not \(devices)") }
        if let shares, !actualParticipants {
            guard shares >= 2, shares <= devices - 1 else { throw fail("shares must be in 2...\(devices - 1) (devices - 1), not \(shares)") }
            guard shares % 2 == 0 || shares == devices - 1 else {
                throw fail("shares must be even (half the neighbours on each side of the ring), not \(shares)")
            }
        }
        let neighbours = neighbourCount(devices: devices)
        guard threshold >= 2 else { throw fail("threshold must be at least 2, not \(threshold)") }
        guard actualParticipants || threshold <= neighbours else { throw fail("threshold \(threshold) exceeds the \(neighbours) neighbours that hold shares") }
        guard 2 * threshold > (actualParticipants ? (shares ?? neighbours) : neighbours) else {
            throw fail("threshold \(threshold) must be above half of the \(neighbours) neighbours")
        }
        guard clippingRange > 0, clippingRange.isFinite else { throw fail("clipping_range must be a positive number, not \(clippingRange)") }
        guard quantizationRange >= 2 else { throw fail("quantization_range must be at least 2, not \(quantizationRange)") }
        guard (1...32).contains(modulusBits) else { throw fail("modulus_bits must be in 1...32, not \(modulusBits)") }
        guard maximumSampleCount >= 1 else { throw fail("the maximum sample count must be at least 1, not \(maximumSampleCount)") }
        // (Q − 1) · devices · n_max and devices · n_max (the sample-count word) must stay below 2^bits.
        let (weight, overflowA) = UInt64(devices).multipliedReportingOverflow(by: UInt64(maximumSampleCount))
        let (largest, overflowB) = weight.multipliedReportingOverflow(by: UInt64(quantizationRange - 1))
        guard !overflowA, !overflowB, largest < (UInt64(1) << UInt64(modulusBits)) else {
            throw fail(
                "(quantization_range - 1) * devices * maximum sample count = \(quantizationRange - 1) * \(devices) * \(maximumSampleCount) reaches 2^\(modulusBits): the sum would wrap"
            )
        }
    }
}

/// The former name of ``SecureAggregationParameters`` (the process's setting is the wire type `SecureAggregationConfig`).
@available(*, deprecated, renamed: "SecureAggregationParameters")
public typealias SecureAggregationConfiguration = SecureAggregationParameters
