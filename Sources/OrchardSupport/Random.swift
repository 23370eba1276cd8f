/// Orchard's seeded pseudo-random generator: xoshiro256** (Blackman & Vigna 2018), seeded through SplitMix64.
///
/// Every random choice in the engine — weight initialisation, shuffling, dropout masks — draws from this
/// generator, so a fixed seed reproduces a run bit for bit on every platform. Its whole state is four `UInt64`
/// words (``stateWords``), which a resumable training state stores and restores.
///
/// The helpers (``nextFloat()``, ``nextInt(below:)``, ``shuffle(_:)``) are defined here rather than taken from
/// the standard library, whose algorithms are not promised to stay the same across releases; none of them calls
/// a math library function, so streams are identical on every platform.
public struct OrchardRandom: RandomNumberGenerator, Sendable, Hashable {
    @usableFromInline var state: (UInt64, UInt64, UInt64, UInt64)

    /// Creates a generator from a seed; equal seeds give equal streams.
    public init(seed: UInt64) {
        var mixer = SplitMix64(state: seed)
        state = (mixer.next(), mixer.next(), mixer.next(), mixer.next())
    }

    /// Restores a generator from state words previously read from ``stateWords``; nil unless there are four
    /// words, not all zero (xoshiro's one forbidden state).
    public init?(state: [UInt64]) {
        guard state.count == 4, state.contains(where: { $0 != 0 }) else { return nil }
        self.state = (state[0], state[1], state[2], state[3])
    }

    /// The state as an array of four words, for storage.
    public var stateWords: [UInt64] { [state.0, state.1, state.2, state.3] }

    /// A derived generator for an independent purpose (e.g. shuffling vs. dropout), reproducible from this one's seed.
    /// - Parameter stream: Distinguishes the derived streams; equal streams from equal seeds give equal generators.
    public static func derived(seed: UInt64, stream: UInt64) -> OrchardRandom {
        var mixer = SplitMix64(state: seed ^ (stream &* 0xD1B5_4A32_D192_ED03))
        return OrchardRandom(seed: mixer.next())
    }

    /// The next 64 random bits.
    @inlinable
    public mutating func next() -> UInt64 {
        let result = Self.rotateLeft(state.1 &* 5, 7) &* 9
        let t = state.1 << 17
        state.2 ^= state.0
        state.3 ^= state.1
        state.1 ^= state.2
        state.0 ^= state.3
        state.2 ^= t
        state.3 = Self.rotateLeft(state.3, 45)
        return result
    }

    /// A uniform Float in `[0, 1)` with 24 random bits.
    @inlinable
    public mutating func nextFloat() -> Float {
        Float(next() >> 40) * (1.0 / 16_777_216.0)
    }

    /// A uniform Double in `[0, 1)` with 53 random bits.
    @inlinable
    public mutating func nextDouble() -> Double {
        Double(next() >> 11) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// A uniform integer in `0..<bound` (Lemire's unbiased multiply-and-reject method).
    /// - Parameter bound: The exclusive upper limit; must be positive.
    public mutating func nextInt(below bound: Int) -> Int {
        precondition(bound > 0, "bound must be positive")
        let b = UInt64(bound)
        var product = next().multipliedFullWidth(by: b)
        if product.low < b {
            let threshold = (0 &- b) % b
            while product.low < threshold {
                product = next().multipliedFullWidth(by: b)
            }
        }
        return Int(product.high)
    }

    /// A uniform Float in `[-limit, limit)`.
    @inlinable
    public mutating func nextFloat(symmetric limit: Float) -> Float {
        (nextFloat() * 2 - 1) * limit
    }

    /// Shuffles `values` in place with the Fisher–Yates algorithm.
    public mutating func shuffle<C: MutableCollection & RandomAccessCollection>(_ values: inout C) where C.Index == Int {
        guard values.count > 1 else { return }
        let start = values.startIndex
        for i in stride(from: values.count - 1, to: 0, by: -1) {
            let j = nextInt(below: i + 1)
            values.swapAt(start + i, start + j)
        }
    }

    @inlinable
    static func rotateLeft(_ x: UInt64, _ k: UInt64) -> UInt64 { (x << k) | (x >> (64 - k)) }

    public static func == (lhs: OrchardRandom, rhs: OrchardRandom) -> Bool { lhs.stateWords == rhs.stateWords }
    public func hash(into hasher: inout Hasher) { hasher.combine(stateWords) }
}

/// SplitMix64 (Steele, Lea & Flood 2014): expands one seed word into well-mixed state words; also the small
/// seeded generator of tests and simulations (production randomness is `SystemRandomNumberGenerator`).
public struct SplitMix64: RandomNumberGenerator, Sendable, Hashable {
    /// The generator's single state word.
    public var state: UInt64

    /// Creates a generator whose first output is fixed by `state`.
    public init(state: UInt64) { self.state = state }

    /// Creates a generator from a seed (the same stream as `init(state:)`).
    public init(seed: UInt64) { self.state = seed }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= Self.increment
        return Self.mix(state)
    }

    /// The golden-ratio increment added to the state before each output.
    public static let increment: UInt64 = 0x9E37_79B9_7F4A_7C15

    /// SplitMix64's output function (a bijective 64-bit finaliser), for hashing words into uniform bits.
    @inlinable
    public static func mix(_ word: UInt64) -> UInt64 {
        var z = word
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
