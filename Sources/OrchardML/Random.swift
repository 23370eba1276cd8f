import Foundation

/// A small, fast, seeded pseudo-random generator: xoshiro256** (Blackman & Vigna 2018), seeded through SplitMix64.
///
/// Every random choice Orchard makes (weight initialisation, shuffles, splits, partitions, simulated devices)
/// takes a generator as a parameter, so a run is reproducible from its seed on every platform. The output
/// sequence is part of the contract: it does not depend on the platform or the Swift version. Not for
/// cryptographic use.
public struct SeededRandom: RandomNumberGenerator, Sendable, Hashable {
    private var s0: UInt64
    private var s1: UInt64
    private var s2: UInt64
    private var s3: UInt64

    /// Creates a generator whose sequence is fully determined by `seed` and `stream`.
    /// - Parameters:
    ///   - seed: The run's seed.
    ///   - stream: Selects an independent sequence for the same seed (e.g. one per client or per epoch).
    public init(seed: UInt64, stream: UInt64 = 0) {
        var mixer = SplitMix64(state: seed ^ (stream &* 0xD1B5_4A32_D192_ED03))
        s0 = mixer.next()
        s1 = mixer.next()
        s2 = mixer.next()
        s3 = mixer.next()
        if s0 | s1 | s2 | s3 == 0 { s0 = 0x9E37_79B9_7F4A_7C15 }  // the all-zero state is a fixed point
    }

    /// Returns the next 64 random bits.
    public mutating func next() -> UInt64 {
        let result = rotate(s1 &* 5, 7) &* 9
        let t = s1 << 17
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = rotate(s3, 45)
        return result
    }

    /// A uniform `Double` in `[0, 1)` with 53 random bits.
    public mutating func nextUnit() -> Double {
        Double(next() >> 11) * 0x1.0p-53
    }

    /// A uniform integer in `0..<upperBound` without modulo bias (Lemire's method).
    /// - Parameter upperBound: The exclusive bound; must be positive.
    public mutating func nextIndex(below upperBound: Int) -> Int {
        precondition(upperBound > 0, "upper bound must be positive")
        let bound = UInt64(upperBound)
        var product = next().multipliedFullWidth(by: bound)
        if product.low < bound {
            let threshold = (0 &- bound) % bound
            while product.low < threshold { product = next().multipliedFullWidth(by: bound) }
        }
        return Int(product.high)
    }

    /// A standard normal sample (Box–Muller; one of the pair is discarded so the stream stays stateless).
    public mutating func nextStandardNormal() -> Double {
        var u = nextUnit()
        while u == 0 { u = nextUnit() }
        let v = nextUnit()
        return (-2 * log(u)).squareRoot() * cos(2 * Double.pi * v)
    }

    /// Shuffles `elements` in place with the Fisher–Yates algorithm (stable across platforms, unlike the
    /// standard library's unspecified `shuffle(using:)`).
    public mutating func shuffle<C: MutableCollection & RandomAccessCollection>(_ elements: inout C) where C.Index == Int {
        var i = elements.count - 1
        let start = elements.startIndex
        while i > 0 {
            let j = nextIndex(below: i + 1)
            elements.swapAt(start + i, start + j)
            i -= 1
        }
    }

    /// A uniformly random permutation of `0..<count`.
    public mutating func permutation(_ count: Int) -> [Int] {
        var indices = Array(0..<count)
        shuffle(&indices)
        return indices
    }

    @inline(__always) private func rotate(_ x: UInt64, _ k: UInt64) -> UInt64 { (x << k) | (x >> (64 - k)) }
}

/// SplitMix64 (Steele, Lea & Flood 2014), used to expand a seed into xoshiro's state.
struct SplitMix64 {
    var state: UInt64

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
