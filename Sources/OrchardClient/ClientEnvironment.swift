public import OrchardSupport
import Foundation
import OrchardML
import Synchronization

/// Time and randomness as the client sees them, injected so tests and the simulator control both.
public struct ClientEnvironment: Sendable {
    /// The wall clock: dates of earliest begins and checkpoints, and the waits between retries.
    public var clock: any WallClock
    /// A uniform random number in 0..<1 (backoff jitter).
    public var random: @Sendable () -> Double
    /// 64 random bits for local differential privacy's noise: the system's cryptographically secure generator
    /// unless a test or the simulator seeds it.
    public var noiseBits: @Sendable () -> UInt64

    /// Creates an environment; `noiseBits` defaults to the system's cryptographically secure generator.
    public init(
        clock: any WallClock, random: @escaping @Sendable () -> Double,
        noiseBits: @escaping @Sendable () -> UInt64 = {
            var system = SystemRandomNumberGenerator(); return system.next()
        }
    ) {
        self.clock = clock
        self.random = random
        self.noiseBits = noiseBits
    }

    /// The system clock and the system random number generator.
    public static let system = ClientEnvironment(clock: SystemClock(), random: { Double.random(in: 0..<1) })

    /// The noise source as a generator.
    var noiseGenerator: NoiseGenerator { NoiseGenerator(draw: noiseBits) }

    /// ``noiseBits`` as a `RandomNumberGenerator`.
    struct NoiseGenerator: RandomNumberGenerator {
        let draw: @Sendable () -> UInt64
        mutating func next() -> UInt64 { draw() }
    }

    /// A clock (the system's by default) with a seeded random stream (the engine's xoshiro256**) for
    /// reproducible jitter. Local differential privacy's noise stays the system's cryptographically secure
    /// generator unless `seedNoise` is set — for simulations and tests only: seeded noise can be subtracted by anyone
    /// who knows the seed.
    public static func seeded(_ seed: UInt64, clock: any WallClock = SystemClock(), seedNoise: Bool = false) -> ClientEnvironment {
        let generator = Mutex(OrchardRandom(seed: seed))
        guard seedNoise else { return ClientEnvironment(clock: clock, random: { generator.withLock { $0.nextDouble() } }) }
        let noise = Mutex(OrchardRandom(seed: seed ^ 0x9E37_79B9_7F4A_7C15))
        return ClientEnvironment(clock: clock, random: { generator.withLock { $0.nextDouble() } }, noiseBits: { noise.withLock { $0.next() } })
    }
}
