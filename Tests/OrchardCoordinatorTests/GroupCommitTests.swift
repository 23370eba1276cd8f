@testable import OrchardCoordinator
import Synchronization
import Testing

/// Group commit: writes that arrive during a transaction share the next one; outcomes stay per write.
@Suite struct GroupCommitTests {
    struct Refused: Error, Equatable {}

    /// A commit function that records its batches, holds the first one until released, and refuses "bad".
    final class Recorder: Sendable {
        let batches = Mutex<[[String]]>([])
        let gate: AsyncStream<Void>
        let open: AsyncStream<Void>.Continuation
        let failEverything = Mutex(false)

        init() { (gate, open) = AsyncStream.makeStream(of: Void.self) }

        func commit(_ items: [String]) async throws -> [Result<Void, any Error>] {
            let first = batches.withLock { batches in
                batches.append(items)
                return batches.count == 1
            }
            if first {
                var iterator = gate.makeAsyncIterator()
                _ = await iterator.next()
            }
            if failEverything.withLock({ $0 }) { throw Refused() }
            return items.map { $0 == "bad" ? .failure(Refused()) : .success(()) }
        }
    }

    @Test func writesArrivingDuringATransactionShareTheNextOneAndKeepTheirOwnOutcomes() async throws {
        let recorder = Recorder()
        let commits = GroupCommit<String> { try await recorder.commit($0) }
        async let first: Void = commits.submit("a")
        // Wait (by yielding, not by time) until the first transaction is running and holds its batch.
        while recorder.batches.withLock({ $0.count }) == 0 { await Task.yield() }
        async let b: Void = commits.submit("b")
        async let bad: Void = commits.submit("bad")
        async let c: Void = commits.submit("c")
        while commits.waiting < 3 { await Task.yield() }
        recorder.open.yield()

        try await first
        try await b
        try await c
        var refused = false
        do { try await bad } catch is Refused { refused = true }
        #expect(refused)
        let batches = recorder.batches.withLock { $0 }
        #expect(batches.count == 2)
        #expect(batches.first == ["a"])
        #expect(Set(batches.last ?? []) == ["b", "bad", "c"])
    }

    @Test func aFailedTransactionFailsEveryWriteInIt() async throws {
        let recorder = Recorder()
        recorder.open.yield()
        recorder.failEverything.withLock { $0 = true }
        let commits = GroupCommit<String> { try await recorder.commit($0) }
        await #expect(throws: Refused.self) { try await commits.submit("x") }
        recorder.failEverything.withLock { $0 = false }
        try await commits.submit("y")
        #expect(recorder.batches.withLock { $0 }.last == ["y"])
    }
}
