import Foundation

/// Quantisation of updates for secure aggregation, and the dequantisation of the aggregate.
///
/// A coordinate x is clipped to [−c, c], mapped to u = (x + c)/(2c) · (Q − 1) ∈ [0, Q − 1] and rounded
/// stochastically (up with probability u − ⌊u⌋), so E[q] = u. Device i sends n_i · q_i (and n_i in an extra word);
/// the aggregate S = Σ n_i q_i, N = Σ n_i dequantises to Σ n_i x_i ≈ S · Δ − c · N with Δ = 2c/(Q − 1).
///
/// Error bound: every rounding moves q by less than one level, so for clipped inputs
/// |S · Δ − c · N − Σ n_i x_i| < Δ · N per coordinate, and the dequantised mean is within Δ = 2c/(Q − 1) of the
/// true weighted mean of the clipped updates (plus Float rounding of the result); the error is zero in expectation.
public enum SecureAggregationQuantization {
    /// The levels q ∈ [0, Q − 1] of `values`, clipped to ±`clippingRange` and stochastically rounded.
    /// - Throws: `invalid_input` for a NaN, fewer than 2 levels or a clipping range that is not a positive number.
    public static func quantize(_ values: [Float], clippingRange: Float, levels: UInt32, using generator: inout some RandomNumberGenerator) throws(SecureAggregationError) -> [UInt32] {
        guard levels >= 2, clippingRange > 0, clippingRange.isFinite else {
            throw SecureAggregationError(.invalidInput, "quantisation needs at least 2 levels (not \(levels)) and a positive clipping range (not \(clippingRange))")
        }
        let c = Double(clippingRange), top = levels - 1, scale = Double(top) / (2 * c)
        var result = [UInt32](repeating: 0, count: values.count)
        var bits: UInt64 = 0
        for (i, value) in values.enumerated() {
            guard !value.isNaN else { throw SecureAggregationError(.invalidInput, "coordinate \(i) of the update is NaN") }
            // u ∈ [0, Q − 1], so truncation is the floor (a conversion instruction, not a call to floor()).
            let u = min((min(max(Double(value), -c), c) + c) * scale, Double(top))
            let floor = UInt32(u)
            // One 64-bit draw gives two uniform 32-bit fractions (the generic `Double.random(in:using:)` costs
            // several times the rest of the loop).
            if i & 1 == 0 { bits = generator.next() }
            let uniform = Double(UInt32(truncatingIfNeeded: i & 1 == 0 ? bits : bits >> 32)) * 0x1p-32
            result[i] = min(floor &+ (uniform < u - Double(floor) ? 1 : 0), top)
        }
        return result
    }

    /// Σ n_i x_i per coordinate from the aggregate levels S and total weight N: S · Δ − c · N.
    public static func weightedSum(_ sum: [UInt32], totalSampleCount: Int, clippingRange: Float, levels: UInt32) -> [Double] {
        let c = Double(clippingRange), step = 2 * c / Double(max(levels, 2) - 1), offset = c * Double(totalSampleCount)
        return sum.map { Double($0) * step - offset }
    }

    /// The weighted mean Σ n_i x_i / N per coordinate (zeros when N is 0).
    public static func mean(_ sum: [UInt32], totalSampleCount: Int, clippingRange: Float, levels: UInt32) -> [Float] {
        guard totalSampleCount > 0 else { return [Float](repeating: 0, count: sum.count) }
        let n = Double(totalSampleCount)
        return weightedSum(sum, totalSampleCount: totalSampleCount, clippingRange: clippingRange, levels: levels).map { Float($0 / n) }
    }
}
