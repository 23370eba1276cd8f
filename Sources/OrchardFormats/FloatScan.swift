/// One-pass scans of Float32 values that the coordinator and the SDK run over every model and update: written with
/// independent accumulators so that they run at memory speed, not at one floating-point add's latency per value.
public enum FloatScan {
    /// What ``summary(littleEndian:)`` found.
    public struct Summary: Sendable, Hashable {
        /// Whether every value is finite (neither NaN nor infinity).
        public var allFinite: Bool
        /// Whether every value is zero (of either sign).
        public var allZero: Bool
        /// The sum of the values' squares, in Double.
        public var sumOfSquares: Double
    }

    /// Whether every value is finite (neither NaN nor infinity).
    public static func allFinite(_ values: UnsafeBufferPointer<Float>) -> Bool {
        // NaN and infinity are the values whose exponent bits are all ones: adding one to the exponent field
        // carries into the sign bit for them only. OR, AND and add are associative, so the loop vectorizes.
        var flags: UInt32 = 0
        for value in values { flags |= (value.bitPattern & 0x7F80_0000) &+ 0x0080_0000 }
        return flags & 0x8000_0000 == 0
    }

    /// Whether every value is finite (neither NaN nor infinity).
    public static func allFinite(_ values: [Float]) -> Bool {
        values.withUnsafeBufferPointer { allFinite($0) }
    }

    /// Scans little-endian Float32 values held as bytes at any alignment (a trailing partial value is ignored).
    public static func summary(littleEndian bytes: UnsafeRawBufferPointer) -> Summary {
        let count = bytes.count / 4
        var flags: UInt32 = 0
        var bits: UInt32 = 0
        var s = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        var i = 0
        #if _endian(little)
        // Eight running sums, so the adds do not wait on each other.
        while i + 8 <= count {
            let w = bytes.loadUnaligned(fromByteOffset: i * 4, as: SIMD8<UInt32>.self)
            let exponents = (w & 0x7F80_0000) &+ 0x0080_0000
            flags |= (exponents[0] | exponents[1] | exponents[2] | exponents[3]) | (exponents[4] | exponents[5] | exponents[6] | exponents[7])
            bits |= (w[0] | w[1] | w[2] | w[3]) | (w[4] | w[5] | w[6] | w[7])
            let v0 = Double(Float(bitPattern: w[0])), v1 = Double(Float(bitPattern: w[1]))
            let v2 = Double(Float(bitPattern: w[2])), v3 = Double(Float(bitPattern: w[3]))
            let v4 = Double(Float(bitPattern: w[4])), v5 = Double(Float(bitPattern: w[5]))
            let v6 = Double(Float(bitPattern: w[6])), v7 = Double(Float(bitPattern: w[7]))
            s.0 += v0 * v0; s.1 += v1 * v1; s.2 += v2 * v2; s.3 += v3 * v3
            s.4 += v4 * v4; s.5 += v5 * v5; s.6 += v6 * v6; s.7 += v7 * v7
            i += 8
        }
        #endif
        var squares = ((s.0 + s.1) + (s.2 + s.3)) + ((s.4 + s.5) + (s.6 + s.7))
        while i < count {
            let word = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: i * 4, as: UInt32.self))
            flags |= (word & 0x7F80_0000) &+ 0x0080_0000
            bits |= word
            let value = Double(Float(bitPattern: word))
            squares += value * value
            i += 1
        }
        return Summary(allFinite: flags & 0x8000_0000 == 0, allZero: bits & 0x7FFF_FFFF == 0, sumOfSquares: squares)
    }
}
