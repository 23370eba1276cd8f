import Synchronization

/// A counting semaphore for async code: at most `permits` holders at once, admitted in arrival order.
///
/// Waiting is not cancellable (a cancelled waiter keeps its place and gets its permit); callers that must not run
/// work after a cancellation check `Task.isCancelled` once admitted.
public final class AsyncSemaphore: Sendable {
    private struct State {
        var free: Int
        var waiters: [CheckedContinuation<Void, Never>] = []
        var head = 0
    }

    private let state: Mutex<State>

    /// Creates a semaphore with `permits` (at least 1).
    public init(permits: Int) {
        precondition(permits >= 1, "a semaphore needs at least one permit")
        state = Mutex(State(free: permits))
    }

    /// Tasks waiting for a permit now.
    public var waiting: Int { state.withLock { $0.waiters.count - $0.head } }

    /// Waits for a permit.
    public func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let admitted = state.withLock { state -> Bool in
                if state.free > 0 {
                    state.free -= 1
                    return true
                }
                state.waiters.append(continuation)
                return false
            }
            if admitted { continuation.resume() }
        }
    }

    /// Returns a permit, admitting the longest waiter if there is one.
    public func signal() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard state.head < state.waiters.count else {
                state.free += 1
                return nil
            }
            let next = state.waiters[state.head]
            state.head += 1
            if state.head == state.waiters.count {
                state.waiters.removeAll(keepingCapacity: true)
                state.head = 0
            }
            return next
        }
        next?.resume()
    }

    /// Runs `body` holding a permit.
    public func withPermit<T, E: Error>(_ body: () async throws(E) -> T) async throws(E) -> T {
        await wait()
        defer { signal() }
        return try await body()
    }
}
