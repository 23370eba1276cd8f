import Foundation
import OrchardSupport
import Synchronization
import Testing

@Suite struct ErrorShapeTests {
    struct SampleError: OrchardError {
        struct Code: CustomStringConvertible {
            enum Kind: String, ErrorCodeKind { case tooManyPendingRequests, io }
            let kind: Kind
            var description: String { kind.snakeCased }
        }
        var code: Code
        var message: String
    }

    @Test func codesRenderInSnakeCaseAndErrorsAsCodeColonMessage() {
        #expect("tooManyPendingRequests".snakeCased == "too_many_pending_requests")
        #expect("io".snakeCased == "io")
        #expect("already_snake".snakeCased == "already_snake")
        let error = SampleError(code: .init(kind: .tooManyPendingRequests), message: "at most 10")
        #expect(error.description == "too_many_pending_requests: at most 10")
        #expect("\(error)" == "too_many_pending_requests: at most 10")
    }
}

@Suite struct DurationTests {
    @Test func secondsAndNanosecondsAreExact() {
        #expect(Duration.seconds(2).inSeconds == 2)
        #expect(Duration.milliseconds(1500).inSeconds == 1.5)
        #expect(Duration.nanoseconds(-250_000_000).inSeconds == -0.25)
        #expect(Duration.seconds(3).inNanoseconds == 3_000_000_000)
        #expect((Duration.seconds(1) + .nanoseconds(7)).inNanoseconds == 1_000_000_007)
        // Beyond what Int64 nanoseconds hold (about 292 years) the value saturates instead of trapping.
        #expect(Duration.seconds(1e10).inNanoseconds == .max)
        #expect(Duration.seconds(-1e10).inNanoseconds == .min)
        #expect(Duration.seconds(9_223_372_036).inNanoseconds == 9_223_372_036_000_000_000)
    }
}

@Suite struct ClockTests {
    @Test func wallInstantsRoundTripDatesAndStayExactFarFromTheEpoch() {
        let date = Date(timeIntervalSince1970: 1_700_000_000.25)
        #expect(WallInstant(date).date == date)
        let start = WallInstant(sinceEpoch: .seconds(1_700_000_000))
        // 5e-7 s steps stay exact as Durations, where Double seconds since 1970 would round them away.
        let later = start.advanced(by: .nanoseconds(500))
        #expect(start.duration(to: later) == .nanoseconds(500))
        #expect(start < later)
    }

    @Test func manualClockMovesOnlyWhenToldAndNeverBack() {
        let clock = ManualClock()
        let start = clock.now
        clock.advance(bySeconds: 1.5)
        #expect(start.duration(to: clock.now) == .milliseconds(1500))
        clock.advance(to: start)
        #expect(start.duration(to: clock.now) == .milliseconds(1500))
        #expect(clock.date == start.date.addingTimeInterval(1.5))
    }

    @Test func aSleeperWakesWhenTheClockReachesItsDeadline() async throws {
        let clock = ManualClock()
        let deadline = clock.now.advanced(by: .seconds(10))
        let woke = Shared(false)
        let sleeper = Task {
            try await clock.sleep(until: deadline)
            woke.withLock { $0 = true }
        }
        // Moving short of the deadline leaves the sleeper asleep; a due sleep returns at once.
        clock.advance(by: .seconds(9))
        try await clock.sleep(until: clock.now)
        #expect(!woke.withLock { $0 })
        clock.advance(by: .seconds(1))
        try await sleeper.value
        #expect(woke.withLock { $0 })
    }

    @Test func aCancelledSleeperThrows() async {
        let clock = ManualClock()
        let sleeper = Task { try await clock.sleepUntilCancelled() }
        sleeper.cancel()
        await #expect(throws: CancellationError.self) { try await sleeper.value }
    }

    @Test func theSystemClockReadsTheSystemDate() {
        let before = Date()
        let now = SystemClock().date
        #expect(now >= before.addingTimeInterval(-1) && now <= Date().addingTimeInterval(1))
    }
}

@Suite struct AsyncSemaphoreTests {
    @Test func holdersNeverExceedThePermitsAndWaitersRunInArrivalOrder() async {
        let semaphore = AsyncSemaphore(permits: 1)
        let order = Shared<[Int]>([])
        // Hold the only permit so every task below queues, then release it and watch the order.
        await semaphore.wait()
        let started = AsyncStream<Int>.makeStream()
        var tasks: [Task<Void, Never>] = []
        for i in 0..<5 {
            tasks.append(
                Task {
                    started.continuation.yield(i)
                    await semaphore.withPermit { order.withLock { $0.append(i) } }
                })
            // Enqueue one at a time so the arrival order is known.
            var iterator = started.stream.makeAsyncIterator()
            _ = await iterator.next()
            while semaphore.waiting < i + 1 { await Task.yield() }
        }
        semaphore.signal()
        for task in tasks { await task.value }
        #expect(order.withLock { $0 } == [0, 1, 2, 3, 4])
    }

    @Test func countsConcurrentHolders() async {
        let semaphore = AsyncSemaphore(permits: 2)
        let state = Shared((current: 0, peak: 0))
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    await semaphore.withPermit {
                        state.withLock {
                            $0.current += 1; $0.peak = max($0.peak, $0.current)
                        }
                        await Task.yield()
                        state.withLock { $0.current -= 1 }
                    }
                }
            }
        }
        #expect(state.withLock { $0.peak } <= 2)
        #expect(state.withLock { $0.current } == 0)
    }

    /// `tryWait` takes a free permit and never waits: not while the permit is held (by a holder or handed to a waiter).
    @Test func tryWaitTakesOnlyAFreePermit() async throws {
        let semaphore = AsyncSemaphore(permits: 1)
        #expect(semaphore.tryWait())
        #expect(!semaphore.tryWait())
        let queued = Task { await semaphore.wait() }
        while semaphore.waiting == 0 { await Task.yield() }
        semaphore.signal()  // handed to the queued waiter, not left for a later tryWait
        await queued.value
        #expect(!semaphore.tryWait())
        semaphore.signal()
        #expect(semaphore.tryWait())
        semaphore.signal()
    }

    /// A cancellable waiter that is cancelled gives its place up at once: the ones behind it keep their order, and the
    /// permit it would have had goes to the next.
    @Test func aCancelledWaiterGivesItsPlaceUp() async throws {
        let semaphore = AsyncSemaphore(permits: 1)
        let order = Shared<[Int]>([])
        await semaphore.wait()
        var tasks: [Task<Bool, Never>] = []
        for i in 0..<3 {
            tasks.append(
                Task {
                    do {
                        try await semaphore.waitUnlessCancelled()
                    } catch {
                        return false
                    }
                    order.withLock { $0.append(i) }
                    semaphore.signal()
                    return true
                })
            while semaphore.waiting < i + 1 { await Task.yield() }
        }
        tasks[1].cancel()
        #expect(await tasks[1].value == false)
        #expect(semaphore.waiting == 2)
        semaphore.signal()
        let first = await tasks[0].value, third = await tasks[2].value
        #expect(first && third)
        #expect(order.withLock { $0 } == [0, 2])
        // Every permit came back: one is free now.
        try await semaphore.waitUnlessCancelled()
        #expect(semaphore.waiting == 0)

        // Cancelled before it begins to wait: it never takes a place, even when a permit is free.
        semaphore.signal()
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            do {
                try await semaphore.waitUnlessCancelled()
                return true
            } catch {
                return false
            }
        }
        #expect(await early.value == false)
        await semaphore.withPermit {}
    }

    @Test func aThrowingBodyReturnsItsPermit() async {
        struct Failure: Error {}
        let semaphore = AsyncSemaphore(permits: 1)
        await #expect(throws: Failure.self) { try await semaphore.withPermit { () async throws(Failure) in throw Failure() } }
        // The permit came back: this does not wait forever.
        await semaphore.withPermit {}
    }
}

/// A value shared by the tasks of a test.
final class Shared<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    func withLock<R: Sendable>(_ body: (inout sending Value) -> sending R) -> R { value.withLock(body) }
}
