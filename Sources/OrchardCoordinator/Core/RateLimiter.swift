import Foundation

/// A token-bucket limit: up to `burst` requests at once, refilled at `perSecond` requests per second.
public struct RateLimit: Sendable, Hashable, CustomStringConvertible {
    /// Requests allowed back to back (the bucket's size).
    public var burst: Int
    /// Requests allowed per second over time (the refill rate).
    public var perSecond: Double

    /// Creates a limit.
    public init(burst: Int, perSecond: Double) {
        self.burst = burst
        self.perSecond = perSecond
    }

    /// One request per `seconds` seconds, no burst.
    public static func once(per seconds: Double) -> RateLimit { RateLimit(burst: 1, perSecond: 1 / seconds) }

    /// Describes what is wrong with the limit, or nil when it is usable.
    public func validationFailure() -> String? {
        if burst < 1 { return "burst must be at least 1, not \(burst)" }
        if !(perSecond > 0) || !perSecond.isFinite { return "the rate must be a positive number per second, not \(perSecond)" }
        return nil
    }

    public var description: String { "\(burst) at once, then \(perSecond) per second" }
}

/// A token bucket on an injected clock's dates: full at first, one token per request.
struct TokenBucket: Sendable, Hashable {
    private(set) var tokens: Double
    private(set) var updated: Date

    /// A full bucket at `now`.
    init(_ limit: RateLimit, now: Date) {
        tokens = Double(limit.burst)
        updated = now
    }

    /// The tokens held at `now` (a clock that went back refills nothing).
    func tokens(at now: Date, _ limit: RateLimit) -> Double {
        min(Double(limit.burst), tokens + max(0, now.timeIntervalSince(updated)) * limit.perSecond)
    }

    /// Takes a token at `now`: nil when one was there, else the seconds until one will be (nothing is taken).
    mutating func take(at now: Date, _ limit: RateLimit) -> Double? {
        let available = tokens(at: now, limit)
        tokens = available
        updated = max(updated, now)
        guard available >= 1 else { return (1 - available) / limit.perSecond }
        tokens -= 1
        return nil
    }
}

/// One token bucket per key (a client address, a worker), holding at most `capacity` buckets: when full, buckets
/// that have refilled completely are forgotten (they hold nothing a new bucket would not), and while none has,
/// requests for new keys are refused as if their bucket were empty.
struct RateLimiter<Key: Hashable & Sendable>: Sendable {
    let limit: RateLimit
    let capacity: Int
    private var buckets: [Key: TokenBucket] = [:]

    init(_ limit: RateLimit, capacity: Int = 100_000) {
        self.limit = limit
        self.capacity = max(capacity, 1)
    }

    /// The buckets currently remembered.
    var count: Int { buckets.count }

    /// The seconds `key` must wait at `now` before a token is there (nil: one is), without taking it.
    func wait(_ key: Key, at now: Date) -> Double? {
        guard let bucket = buckets[key] else { return nil }
        let available = bucket.tokens(at: now, limit)
        return available >= 1 ? nil : (1 - available) / limit.perSecond
    }

    /// Takes a token for `key` at `now`: nil when allowed, else the seconds to wait.
    mutating func take(_ key: Key, at now: Date) -> Double? {
        if var bucket = buckets[key] {
            let wait = bucket.take(at: now, limit)
            buckets[key] = bucket
            return wait
        }
        if buckets.count >= capacity {
            let limit = self.limit
            buckets = buckets.filter { $0.value.tokens(at: now, limit) < Double(limit.burst) }
            guard buckets.count < capacity else { return 1 / limit.perSecond }
        }
        var bucket = TokenBucket(limit, now: now)
        let wait = bucket.take(at: now, limit)
        buckets[key] = bucket
        return wait
    }
}

/// Where a request came from, as the HTTP edge saw it (the peer's IP address, without its port), so the domain can
/// limit per client without knowing HTTP.
public struct ClientAddress: Sendable, Hashable, CustomStringConvertible {
    /// The address, e.g. `127.0.0.1` or `::1`.
    public var value: String

    /// Creates an address.
    public init(_ value: String) { self.value = value }

    public var description: String { value }
}
