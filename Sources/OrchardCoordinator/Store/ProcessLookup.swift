import Foundation
import OrchardProtocol

/// Which names a coordinator instance over a shared store may look up in the store when it does not know them, so that
/// a process hosted through another instance is found at once while a stream of unknown names cannot become a way to
/// hammer the database.
///
/// A name looked up and not found is remembered as missing for ``missLifetime`` (up to ``capacity`` names, the oldest
/// forgotten first); on top of that, misses may reach the store ``missBudget`` times at most (a token bucket shared by
/// every unknown name). A name the budget turns away is answered `rate_limited` with the wait (not `unknown_process`:
/// it may exist), and looked up once the budget allows. A name the instance learns exists (it hosts it, or a refresh loads it) is no longer missing.
struct ProcessLookup: Sendable {
    /// A process named by its id, or by its name and version.
    enum Name: Sendable, Hashable {
        case id(String)
        case nameVersion(String, SemanticVersion)
    }

    /// What to do about a name this instance does not know.
    enum Decision: Sendable, Hashable {
        /// Look it up in the store.
        case lookUp
        /// Answer unknown: it was found missing less than ``missLifetime`` ago.
        case knownMissing
        /// Answer "try again" (429): the lookup budget is spent for now; a token comes back after `retryAfter` seconds.
        case overBudget(retryAfter: Double)
    }

    /// How long a name found missing is answered unknown without another lookup.
    var missLifetime: TimeInterval = 1
    /// Lookups of unknown names allowed at once, then per second.
    var missBudget = RateLimit(burst: 20, perSecond: 10)
    /// Names remembered as missing at most.
    var capacity = 4096

    private var missing: [Name: Date] = [:]
    private var order: [Name] = []
    private var bucket: TokenBucket?

    /// Names currently remembered as missing.
    var rememberedCount: Int { missing.count }

    /// Decides about `name`, unknown to the instance, at `now` (taking a token of the budget when it says look up).
    mutating func decide(_ name: Name, now: Date) -> Decision {
        if let since = missing[name] {
            if now.timeIntervalSince(since) < missLifetime && now >= since { return .knownMissing }
            forget(name)
        }
        var bucket = self.bucket ?? TokenBucket(missBudget, now: now)
        defer { self.bucket = bucket }
        if let wait = bucket.take(at: now, missBudget) { return .overBudget(retryAfter: wait) }
        return .lookUp
    }

    /// Records that `name` was looked up at `now` and not found.
    mutating func recordMissing(_ name: Name, at now: Date) {
        if missing[name] == nil {
            order.append(name)
            if order.count > capacity {
                let evicted = order.removeFirst()
                missing[evicted] = nil
            }
        }
        missing[name] = now
    }

    /// Records that `name` exists (hosted here, or loaded from the store).
    mutating func forget(_ name: Name) {
        guard missing.removeValue(forKey: name) != nil else { return }
        order.removeAll { $0 == name }
    }
}

/// How one lookup of a process an instance did not know ended.
enum ProcessLookupOutcome: Sendable, Hashable {
    /// Found in the store (and loaded).
    case found
    /// Not in the store (or found missing a moment ago).
    case missing
    /// Not looked up: the budget for unknown names is spent; try again after `retryAfter` seconds.
    case limited(retryAfter: Double)
    /// The store could not be read.
    case failed
}

/// How an instance's lookups of processes it did not know ended (over a shared store).
public struct ProcessLookupCounts: Sendable, Hashable {
    /// Looked up in the store and found (hosted through another instance).
    public var found = 0
    /// Looked up in the store and not found.
    public var missing = 0
    /// Answered unknown from memory: found missing a moment before.
    public var cached = 0
    /// Answered unknown without a lookup: the lookup budget was spent.
    public var limited = 0
}
