public import OrchardSupport
public import Foundation
import OrchardML
import Synchronization

/// When and how often the client repeats a call that failed for a transient reason (a network error or a 5xx
/// answer): exponential backoff with jitter, so a fleet that lost its coordinator does not return in step.
public struct RequestRetryPolicy: Sendable, Hashable {
    /// Attempts per call, the first included (1 disables retries).
    public var maximumAttempts: Int
    /// The delay before the first retry, before jitter.
    public var initialDelay: Duration
    /// The largest delay between attempts, before jitter.
    public var maximumDelay: Duration
    /// The fraction of each delay that is random: 0 waits exactly, 1 waits anywhere in 0…delay.
    public var jitter: Double

    /// Creates a policy.
    public init(maximumAttempts: Int = 5, initialDelay: Duration = .milliseconds(500), maximumDelay: Duration = .seconds(30), jitter: Double = 0.5) {
        self.maximumAttempts = maximumAttempts
        self.initialDelay = initialDelay
        self.maximumDelay = maximumDelay
        self.jitter = jitter
    }

    /// No retries.
    public static let none = RequestRetryPolicy(maximumAttempts: 1)

    /// The wait before retry number `retry` (1 for the first retry), given a uniform random number in 0..<1.
    public func delay(beforeRetry retry: Int, random: Double) -> Duration {
        let exponent = min(max(retry - 1, 0), 30)
        let base = min(initialDelay.inSeconds * Double(1 << exponent), maximumDelay.inSeconds)
        let fraction = min(max(jitter, 0), 1)
        let seconds = base * (1 - fraction) + base * fraction * random
        return .nanoseconds(Int64(seconds * 1e9))
    }

}

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

/// Throws ``OrchardClientError/Code/cancelled`` when the current task is cancelled.
func checkCancellation() throws(OrchardClientError) {
    if Task.isCancelled { throw cancelledError() }
}

/// The error for work stopped by task cancellation.
func cancelledError() -> OrchardClientError {
    OrchardClientError(.cancelled, "the task was cancelled")
}

/// The `Retry-After` field of a 429 or 503 answer (RFC 9110 §10.2.3).
public enum RetryAfter {
    /// The seconds from `now` that `value` asks to wait: delta-seconds (`120`), or an HTTP-date (`Sun, 06 Nov 1994
    /// 08:49:37 GMT`, or the obsolete RFC 850 and asctime forms) where a date already past means 0; nil for anything
    /// else.
    public static func seconds(_ value: String, now: Date) -> Double? {
        let text = value.trimmingCharacters(in: .whitespaces)
        guard !text.isEmpty else { return nil }
        if text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
            return Double(text)
        }
        for format in ["EEE, dd MMM yyyy HH:mm:ss 'GMT'", "EEEE, dd-MMM-yy HH:mm:ss 'GMT'", "EEE MMM d HH:mm:ss yyyy"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = format
            if let date = formatter.date(from: text.replacingOccurrences(of: "  ", with: " ")) {
                return max(0, date.timeIntervalSince(now))
            }
        }
        return nil
    }
}
