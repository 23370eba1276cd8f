import Synchronization

/// Group commit: writes submitted while a transaction is running wait and are committed together in the next
/// one, so a burst of reports or admissions costs a few transactions (and, with synced durability, a few syncs)
/// instead of one each. Every submitter still returns only after its own write is committed, with its own
/// outcome.
final class GroupCommit<Item: Sendable>: Sendable {
    private typealias Waiter = (item: Item, continuation: CheckedContinuation<Void, any Error>)

    /// Commits a batch in one transaction and returns each item's outcome in order; a thrown error fails them
    /// all.
    typealias Commit = @Sendable ([Item]) async throws -> [Result<Void, any Error>]

    private let state = Mutex<(pending: [Waiter], draining: Bool)>(([], false))
    private let commit: Commit

    init(_ commit: @escaping Commit) {
        self.commit = commit
    }

    /// Commits `item` (with whatever else is waiting) and returns once it is durable.
    func submit(_ item: Item) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let startDraining = state.withLock { state -> Bool in
                state.pending.append((item, continuation))
                if state.draining { return false }
                state.draining = true
                return true
            }
            if startDraining {
                Task { await self.drain() }
            }
        }
    }

    /// Writes waiting for the next transaction (for tests).
    var waiting: Int { state.withLock { $0.pending.count } }

    /// Commits batches until nothing is waiting.
    private func drain() async {
        while true {
            let batch = state.withLock { state -> [Waiter] in
                let batch = state.pending
                state.pending = []
                if batch.isEmpty { state.draining = false }
                return batch
            }
            guard !batch.isEmpty else { return }
            do {
                let outcomes = try await commit(batch.map(\.item))
                precondition(outcomes.count == batch.count, "a group commit returned \(outcomes.count) outcomes for \(batch.count) items")
                for (waiter, outcome) in zip(batch, outcomes) { waiter.continuation.resume(with: outcome) }
            } catch {
                for waiter in batch { waiter.continuation.resume(throwing: error) }
            }
        }
    }
}
