public import Foundation
import Synchronization

/// The coordinator's source of wall-clock time; deadlines are wall-clock so they survive restarts.
public struct WallClock: Sendable {
    /// Returns the current time.
    public var now: @Sendable () -> Date

    /// Creates a clock from a closure.
    public init(now: @escaping @Sendable () -> Date) { self.now = now }

    /// The system clock.
    public static let system = WallClock { Date() }

    /// A clock that only moves when told to, for tests and simulations.
    public static func manual(_ clock: ManualWallClock) -> WallClock { WallClock { clock.now } }
}

/// A settable wall clock for tests and simulations.
public final class ManualWallClock: Sendable {
    private let current: Mutex<Date>

    /// Creates a clock at `start`.
    public init(start: Date = Date(timeIntervalSince1970: 1_700_000_000)) { current = Mutex(start) }

    /// The current time.
    public var now: Date { current.withLock { $0 } }

    /// Moves the clock forward.
    public func advance(by seconds: Double) { current.withLock { $0 = $0.addingTimeInterval(seconds) } }

    /// Sets the clock.
    public func set(_ date: Date) { current.withLock { $0 = date } }
}

/// A small seedable generator (SplitMix64) for reproducible tests and simulations; production uses
/// `SystemRandomNumberGenerator`.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    /// Creates a generator from a seed.
    public init(seed: UInt64) { state = seed }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Settings of a coordinator instance (per-process settings live in ``OrchardProtocol/ServerConfig``).
public struct CoordinatorConfiguration: Sendable {
    /// The bearer token for the admin API; nil disables the admin API.
    public var adminToken: String?
    /// The largest report body accepted, in bytes.
    public var maximumReportBytes: Int
    /// The largest admin request body accepted (a hosted model), in bytes.
    public var maximumAdminBodyBytes: Int
    /// The largest JSON control message accepted, in bytes.
    public var maximumMessageBytes: Int
    /// Reports folded in memory before the running sum is written back and their diffs dropped.
    public var foldInterval: Int
    /// Seconds a session token stays valid.
    public var sessionLifetime: Double

    /// Creates a configuration.
    public init(adminToken: String? = nil, maximumReportBytes: Int = 256 << 20, maximumAdminBodyBytes: Int = 1 << 30, maximumMessageBytes: Int = 64 << 10, foldInterval: Int = 32, sessionLifetime: Double = 86_400) {
        self.adminToken = adminToken
        self.maximumReportBytes = maximumReportBytes
        self.maximumAdminBodyBytes = maximumAdminBodyBytes
        self.maximumMessageBytes = maximumMessageBytes
        self.foldInterval = foldInterval
        self.sessionLifetime = sessionLifetime
    }
}
