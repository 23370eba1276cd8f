import Synchronization

/// A virtual device's clock: time moves only when the device's own work moves it (a transfer, a stretch of
/// training, waiting for the next background window), so a day of a device's life takes as long as its
/// computation. The device's ``OrchardScheduler/BackgroundScheduler`` times its runs on it: a sleep until an
/// instant ends when the device's work moves the clock there (or when the sleeping task is cancelled).
public final class VirtualClock: Clock, Sendable {
    /// A point on the virtual time line, as an offset from virtual time zero.
    public struct Instant: InstantProtocol, Sendable, Hashable, Comparable {
        /// Time since virtual time zero.
        public var offset: Duration

        /// The instant `offset` after virtual time zero.
        public init(offset: Duration) { self.offset = offset }

        public func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        public func duration(to other: Instant) -> Duration { other.offset - offset }
        public static func < (a: Instant, b: Instant) -> Bool { a.offset < b.offset }
    }

    private struct Sleeper {
        let deadline: Instant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: Instant
        var sleepers: [UInt64: Sleeper] = [:]
        var nextID: UInt64 = 0
    }

    private let state: Mutex<State>

    /// Creates a clock reading `seconds` of virtual time.
    public init(seconds: Double = 0) {
        state = Mutex(State(now: Instant(offset: .seconds(seconds))))
    }

    public var now: Instant { state.withLock { $0.now } }

    public var minimumResolution: Duration { .zero }

    /// The current virtual time in seconds.
    public var seconds: Double { now.offset.virtualSeconds }

    /// Suspends until the clock reaches `deadline`; throws `CancellationError` when the task is cancelled first.
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
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

    /// Suspends until the task is cancelled (a device waiting for the OS to expire its background task).
    public func sleepUntilCancelled() async throws {
        try await sleep(until: Instant(offset: .seconds(Int64.max / 4)))
    }

    /// Moves the clock forward to `seconds` (never back) and wakes the sleepers whose deadline has come.
    public func advance(to seconds: Double) {
        let target = Instant(offset: .seconds(seconds))
        let due = state.withLock { state -> [Sleeper] in
            guard target > state.now else { return [] }
            state.now = target
            let due = state.sleepers.filter { $0.value.deadline <= target }
            for id in due.keys { state.sleepers[id] = nil }
            return Array(due.values)
        }
        for sleeper in due { sleeper.continuation.resume() }
    }
}

extension Duration {
    /// The duration in seconds, as a `Double`.
    var virtualSeconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) * 1e-18
    }
}
