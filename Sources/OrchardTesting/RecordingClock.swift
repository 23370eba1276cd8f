public import OrchardSupport
import Synchronization

/// A wall clock for tests of code that waits: every sleep is recorded, moves the underlying ``ManualClock`` to its
/// deadline at once, then runs `onSleep` (which may throw, e.g. to stop a retry loop).
public final class RecordingClock: WallClock {
    /// The clock the time is read from.
    public let base: ManualClock
    private let slept = Mutex<[Duration]>([])
    private let onSleep: @Sendable (Duration) async throws -> Void

    /// Creates a clock over `base` (a new ``ManualClock`` by default).
    public init(base: ManualClock = ManualClock(), onSleep: @escaping @Sendable (Duration) async throws -> Void = { _ in }) {
        self.base = base
        self.onSleep = onSleep
    }

    /// The durations slept so far, in order.
    public var sleeps: [Duration] { slept.withLock { $0 } }

    public var now: WallInstant { base.now }
    public var minimumResolution: Duration { .zero }

    public func sleep(until deadline: WallInstant, tolerance: Duration? = nil) async throws {
        let span = max(.zero, base.now.duration(to: deadline))
        slept.withLock { $0.append(span) }
        base.advance(to: deadline)
        try await onSleep(span)
    }
}
