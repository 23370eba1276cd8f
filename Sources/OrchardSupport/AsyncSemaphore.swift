import Synchronization

/// A counting semaphore for async code: at most `permits` holders at once, admitted in arrival order.
///
/// ``wait()`` is not cancellable (a cancelled waiter keeps its place and gets its permit; callers that must not run
/// work after a cancellation check `Task.isCancelled` once admitted). ``waitUnlessCancelled()`` gives its place up
/// when its task is cancelled.
public final class AsyncSemaphore: Sendable {
    private struct Waiter {
        var id: UInt64
        var continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        var free: Int
        /// Waiters in arrival order from `head`; a cancelled one leaves a hole (nil).
        var waiters: [Waiter?] = []
        var head = 0
        var nextID: UInt64 = 0
        /// Cancellable waits begun and not yet admitted, queued or given up.
        var live: Set<UInt64> = []
        /// Cancellable waits cancelled before they were queued.
        var cancelledEarly: Set<UInt64> = []
    }

    private let state: Mutex<State>

    /// Creates a semaphore with `permits` (at least 1).
    public init(permits: Int) {
        precondition(permits >= 1, "a semaphore needs at least one permit")
        state = Mutex(State(free: permits))
    }

    /// Tasks waiting for a permit now.
    public var waiting: Int { state.withLock { $0.waiters[$0.head...].reduce(0) { $0 + ($1 == nil ? 0 : 1) } } }

    /// Takes a permit if one is free and nobody is waiting for it; returns whether it did (never waits).
    public func tryWait() -> Bool {
        state.withLock { state in
            guard state.free > 0, !state.waiters[state.head...].contains(where: { $0 != nil }) else { return false }
            state.free -= 1
            return true
        }
    }

    /// Waits for a permit.
    public func wait() async {
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        _ = await enqueue(id)
    }

    /// Waits for a permit, unless the task is cancelled first: then it gives its place up and throws.
    public func waitUnlessCancelled() async throws(CancellationError) {
        let id = state.withLock { state in
            state.nextID += 1
            state.live.insert(state.nextID)
            return state.nextID
        }
        let admitted = await withTaskCancellationHandler {
            await enqueue(id)
        } onCancel: {
            let dropped = state.withLock { state -> CheckedContinuation<Bool, Never>? in
                if let index = state.waiters[state.head...].firstIndex(where: { $0?.id == id }) {
                    let waiter = state.waiters[index]
                    state.waiters[index] = nil
                    state.live.remove(id)
                    return waiter?.continuation
                }
                if state.live.contains(id) { state.cancelledEarly.insert(id) }
                return nil
            }
            dropped?.resume(returning: false)
        }
        guard admitted else { throw CancellationError() }
    }

    /// Admits `id` at once when a permit is free, or queues it; true once admitted, false when it gave its place up.
    private func enqueue(_ id: UInt64) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let now = state.withLock { state -> Bool? in
                if state.cancelledEarly.remove(id) != nil {
                    state.live.remove(id)
                    return false
                }
                if state.free > 0 {
                    state.free -= 1
                    state.live.remove(id)
                    return true
                }
                state.waiters.append(Waiter(id: id, continuation: continuation))
                return nil
            }
            if let now { continuation.resume(returning: now) }
        }
    }

    /// Returns a permit, admitting the longest waiter if there is one.
    public func signal() {
        let next = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            while state.head < state.waiters.count {
                let waiter = state.waiters[state.head]
                state.head += 1
                if state.head == state.waiters.count {
                    state.waiters.removeAll(keepingCapacity: true)
                    state.head = 0
                }
                if let waiter {
                    state.live.remove(waiter.id)
                    return waiter.continuation
                }
            }
            state.free += 1
            return nil
        }
        next?.resume(returning: true)
    }

    /// Runs `body` holding a permit.
    public func withPermit<T, E: Error>(_ body: () async throws(E) -> T) async throws(E) -> T {
        await wait()
        defer { signal() }
        return try await body()
    }
}
