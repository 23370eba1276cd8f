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
    public static func quantize(_ values: [Float], clippingRange: Float, levels: UInt32, using generator: inout some RandomNumberGenerator)
        throws(SecureAggregationError) -> [UInt32]
    {
        guard levels >= 2, clippingRange > 0, clippingRange.isFinite else {
            throw SecureAggregationError(
                .invalidInput, "quantisation needs at least 2 levels (not \(levels)) and a positive clipping range (not \(clippingRange))")
        }
        let c = Double(clippingRange), top = levels - 1, scale = Double(top) / (2 * c), topLevel = Double(top)
        // A NaN is noted where it is met (the rounding goes on with a placeholder) and refused after the pass.
        var sawNaN = false
        // u ∈ [0, Q − 1], so truncation is the floor (a conversion instruction, not a call to floor()); `uniform` is a
        // fraction in [0, 1).
        @inline(__always) func level(_ value: Float, _ uniform: Double) -> UInt32 {
            guard !value.isNaN else {
                sawNaN = true
                return 0
            }
            let u = min((min(max(Double(value), -c), c) + c) * scale, topLevel)
            let floor = UInt32(u)
            return min(floor &+ (uniform < u - Double(floor) ? 1 : 0), top)
        }
        let quantized = [UInt32](unsafeUninitializedCapacity: values.count) { result, initialized in
            values.withUnsafeBufferPointer { input in
                // One 64-bit draw gives two uniform 32-bit fractions (the generic `Double.random(in:using:)` costs
                // several times the rest of the loop), low half first.
                var i = 0
                // Eight coordinates at a time: the same draws in the same order and the same Double arithmetic as
                // `level`, lane by lane, in exact steps (every value here is below 2^33). A level is an integer below
                // 2^32, so adding 2^52 puts it in the low bits of the Double's pattern.
                let low = SIMD8<Double>(repeating: -c), high = SIMD8<Double>(repeating: c)
                let scales = SIMD8<Double>(repeating: scale), tops = SIMD8<Double>(repeating: topLevel)
                let lift = SIMD8<Double>(repeating: 0x1p52)
                while i + 8 <= input.count {
                    let a: UInt64 = generator.next(), b: UInt64 = generator.next()
                    let d: UInt64 = generator.next(), e: UInt64 = generator.next()
                    #if _endian(little)
                    // The four words' halves, low half first, as one vector (a conversion per vector, not per lane).
                    let halves = unsafeBitCast(SIMD4<UInt64>(a, b, d, e), to: SIMD8<UInt32>.self)
                    let uniform = SIMD8<Double>(halves) * 0x1p-32
                    #else
                    let uniform =
                        SIMD8<Double>(
                            Double(UInt32(truncatingIfNeeded: a)), Double(UInt32(truncatingIfNeeded: a >> 32)),
                            Double(UInt32(truncatingIfNeeded: b)), Double(UInt32(truncatingIfNeeded: b >> 32)),
                            Double(UInt32(truncatingIfNeeded: d)), Double(UInt32(truncatingIfNeeded: d >> 32)),
                            Double(UInt32(truncatingIfNeeded: e)), Double(UInt32(truncatingIfNeeded: e >> 32))
                        ) * 0x1p-32
                    #endif
                    let value = UnsafeRawPointer(input.baseAddress! + i).loadUnaligned(as: SIMD8<Float>.self)
                    if any(value .!= value) { sawNaN = true }
                    // Clamps as selects (the generic pointwiseMin/Max were calls per vector): a NaN lane compares false
                    // everywhere and is refused after the pass.
                    var x = SIMD8<Double>(value)
                    x.replace(with: low, where: x .< low)
                    x.replace(with: high, where: x .> high)
                    var u = (x + high) * scales
                    u.replace(with: tops, where: u .> tops)
                    // The floor without a libm call per lane: round to the nearest integer by 2^52, step down if above.
                    let nearest = (u + lift) - lift
                    var floor = nearest.replacing(with: nearest - 1, where: nearest .> u)
                    floor.replace(with: floor + 1, where: uniform .< u - floor)
                    floor.replace(with: tops, where: floor .> tops)
                    let bits = unsafeBitCast(floor + lift, to: SIMD8<UInt64>.self)
                    UnsafeMutableRawPointer(result.baseAddress! + i).storeBytes(of: SIMD8<UInt32>(truncatingIfNeeded: bits), as: SIMD8<UInt32>.self)
                    i += 8
                }
                while i + 2 <= input.count {
                    let bits: UInt64 = generator.next()
                    result[i] = level(input[i], Double(UInt32(truncatingIfNeeded: bits)) * 0x1p-32)
                    result[i + 1] = level(input[i + 1], Double(UInt32(truncatingIfNeeded: bits >> 32)) * 0x1p-32)
                    i += 2
                }
                if i < input.count {
                    let bits: UInt64 = generator.next()
                    result[i] = level(input[i], Double(UInt32(truncatingIfNeeded: bits)) * 0x1p-32)
                }
            }
            initialized = values.count
        }
        if sawNaN, let nan = values.firstIndex(where: \.isNaN) {
            throw SecureAggregationError(.invalidInput, "coordinate \(nan) of the update is NaN")
        }
        return quantized
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
