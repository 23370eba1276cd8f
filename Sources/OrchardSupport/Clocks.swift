public import Foundation
import Synchronization

/// A point in wall-clock time, as an exact offset from the Unix epoch: the instant of a ``WallClock``.
///
/// Dates that must survive a restart (cycle deadlines, session expiries, a request's earliest begin) are wall
/// time; the offset is a `Duration`, so adding sub-microsecond steps to a date far from 1970 stays exact.
public struct WallInstant: InstantProtocol, Sendable, Hashable, Comparable, CustomStringConvertible {
    /// Time since 1970-01-01T00:00:00Z.
    public var sinceEpoch: Duration

    /// The instant `sinceEpoch` after the Unix epoch.
    public init(sinceEpoch: Duration) { self.sinceEpoch = sinceEpoch }

    /// The instant of a date (to the nanosecond); a date beyond a billion years of 1970 (or not finite) is taken as
    /// that bound, so no date from outside (a far `retry_after`) can trap the conversion.
    public init(_ date: Date) {
        let bound = 3.2e16
        let seconds = date.timeIntervalSince1970.isNaN ? 0 : min(max(date.timeIntervalSince1970, -bound), bound)
        let whole = seconds.rounded(.down)
        sinceEpoch = .seconds(Int64(whole)) + .nanoseconds(Int64(((seconds - whole) * 1e9).rounded()))
    }

    /// The instant as a `Date`.
    public var date: Date { Date(timeIntervalSince1970: sinceEpoch.inSeconds) }

    public func advanced(by duration: Duration) -> WallInstant { WallInstant(sinceEpoch: sinceEpoch + duration) }
    public func duration(to other: WallInstant) -> Duration { other.sinceEpoch - sinceEpoch }
    public static func < (a: WallInstant, b: WallInstant) -> Bool { a.sinceEpoch < b.sinceEpoch }
    public var description: String { date.description }
}

/// Orchard's one way to inject time: a `Clock` whose instants are wall-clock dates.
///
/// Production code uses ``SystemClock``; tests and simulations use ``ManualClock``, which moves only when told to.
public protocol WallClock: Clock, Sendable where Instant == WallInstant {}

extension WallClock {
    /// The current date.
    public var date: Date { now.date }
}

/// The system's wall clock; sleeps last the same span of monotonic time.
public struct SystemClock: WallClock {
    /// Creates the clock.
    public init() {}

    public var now: WallInstant { WallInstant(Date()) }
    public var minimumResolution: Duration { .nanoseconds(1) }

    public func sleep(until deadline: WallInstant, tolerance: Duration? = nil) async throws {
        let span = now.duration(to: deadline)
        if span > .zero { try await Task.sleep(for: span, tolerance: tolerance) }
    }
}

extension WallClock where Self == SystemClock {
    /// The system's wall clock.
    public static var system: SystemClock { SystemClock() }
}

/// A wall clock that moves only when told to (``advance(by:)``, ``advance(to:)``), for tests and simulations:
/// a sleep until an instant ends when the clock is moved there, or throws `CancellationError` when its task is
/// cancelled first.
public final class ManualClock: WallClock {
    private struct Sleeper {
        let deadline: WallInstant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: WallInstant
        var sleepers: [UInt64: Sleeper] = [:]
        var nextID: UInt64 = 0
    }

    private let state: Mutex<State>

    /// Creates a clock reading `start` (by default 2023-11-14T22:13:20Z, a fixed date for reproducible runs).
    public init(start: WallInstant = WallInstant(sinceEpoch: .seconds(1_700_000_000))) {
        state = Mutex(State(now: start))
    }

    /// Creates a clock reading `date`.
    public convenience init(date: Date) { self.init(start: WallInstant(date)) }

    public var now: WallInstant { state.withLock { $0.now } }
    public var minimumResolution: Duration { .zero }

    /// Suspends until the clock reaches `deadline`; throws `CancellationError` when the task is cancelled first.
    public func sleep(until deadline: WallInstant, tolerance: Duration? = nil) async throws {
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let due = state.withLock { state -> Bool in
                    if state.now >= deadline { return true }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return false
                }
                if due {
                    continuation.resume()
                } else if Task.isCancelled {
                    // Cancelled before the sleeper was registered: the cancellation handler found nothing to resume.
                    state.withLock { $0.sleepers.removeValue(forKey: id) }?.continuation.resume(throwing: CancellationError())
                }
            }
        } onCancel: {
            state.withLock { $0.sleepers.removeValue(forKey: id) }?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Suspends until the task is cancelled.
    public func sleepUntilCancelled() async throws {
        try await sleep(until: WallInstant(sinceEpoch: .seconds(Int64.max / 4)))
    }

    /// Moves the clock to `instant` (never back) and wakes the sleepers whose deadline has come.
    public func advance(to instant: WallInstant) {
        let due = state.withLock { state -> [Sleeper] in
            guard instant > state.now else { return [] }
            state.now = instant
            let due = state.sleepers.filter { $0.value.deadline <= instant }
            for id in due.keys { state.sleepers[id] = nil }
            return Array(due.values)
        }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Moves the clock forward by `duration`.
    public func advance(by duration: Duration) {
        advance(to: now.advanced(by: duration))
    }

    /// Moves the clock forward by `seconds`.
    public func advance(bySeconds seconds: Double) {
        advance(by: .seconds(seconds))
    }

    /// Moves the clock forward by `duration` one sleeper's deadline at a time, and before each step and at the end
    /// lets other tasks run: a task woken at one deadline may sleep again (a timer that re-arms, a poll loop) and is
    /// woken in turn if its next deadline falls within `duration`. For tests that drive actors whose loops sleep on
    /// this clock; ``advance(by:)`` moves the clock in one jump and wakes every sleeper that is due at once.
    public func step(by duration: Duration) async {
        let target = now.advanced(by: duration)
        while true {
            await Self.yieldToOtherTasks()
            let next = state.withLock { state -> Sleeper? in
                guard let (id, sleeper) = state.sleepers.min(by: { $0.value.deadline < $1.value.deadline }), sleeper.deadline <= target else {
                    if target > state.now { state.now = target }
                    return nil
                }
                if sleeper.deadline > state.now { state.now = sleeper.deadline }
                state.sleepers[id] = nil
                return sleeper
            }
            guard let next else { break }
            next.continuation.resume()
        }
        await Self.yieldToOtherTasks()
    }

    /// Yields sixteen times, each through a detached task, so that tasks woken a moment ago usually run to their next
    /// suspension before the caller goes on (a heuristic, as swift-clocks' `TestClock` uses: a task waiting on I/O is
    /// not waited for).
    private static func yieldToOtherTasks() async {
        for _ in 0..<16 { await Task.detached(priority: .low) { await Task.yield() }.value }
    }
}
