import Foundation
import OrchardScheduler
import OrchardSupport

/// The wall-clock date every test scheduler starts at.
let startDate = Date(timeIntervalSince1970: 1_700_000_000)

/// A manual clock reading ``startDate`` (plus `offset`), the scheduler tests' clock.
func testClock(offset: Double = 0) -> ManualClock { ManualClock(date: startDate.addingTimeInterval(offset)) }

/// A scheduler on a manual clock with scripted conditions.
func makeScheduler(
    clock: ManualClock,
    permitted: Set<String>,
    conditions: ScriptedConditionsProvider = ScriptedConditionsProvider(),
    store: any SchedulerStore = InMemorySchedulerStore(),
    configure: (inout SchedulerConfiguration) -> Void = { _ in }
) throws -> BackgroundScheduler {
    var configuration = SchedulerConfiguration(permittedIdentifiers: permitted)
    configure(&configuration)
    return try BackgroundScheduler(configuration: configuration, clock: clock, conditions: conditions, store: store)
}

/// A one-shot signal a handler raises and a test awaits.
final class Signal: Sendable {
    private let stream: AsyncStream<Void>
    private let continuation: AsyncStream<Void>.Continuation

    init() {
        (stream, continuation) = AsyncStream<Void>.makeStream()
    }

    func raise() { continuation.yield() }

    func wait() async {
        for await _ in stream { return }
    }
}

/// A counter shared with handlers.
final class Counter: Sendable {
    private let lock = NSLock()
    nonisolated(unsafe) private var count = 0

    func increment() { lock.withLock { count += 1 } }
    var value: Int { lock.withLock { count } }
}

/// A gate a handler waits on, ignoring cancellation, until the test opens it.
final class Gate: Sendable {
    private let lock = NSLock()
    nonisolated(unsafe) private var opened = false
    nonisolated(unsafe) private var waiters: [CheckedContinuation<Void, Never>] = []

    func wait() async {
        await withCheckedContinuation { continuation in
            let resume = lock.withLock { () -> Bool in
                if opened { return true }
                waiters.append(continuation)
                return false
            }
            if resume { continuation.resume() }
        }
    }

    func open() {
        let waiting = lock.withLock { () -> [CheckedContinuation<Void, Never>] in
            opened = true
            defer { waiters = [] }
            return waiters
        }
        for waiter in waiting { waiter.resume() }
    }
}

/// Waits until the surrounding task is cancelled, without any clock.
func waitForCancellation() async throws {
    let (stream, continuation) = AsyncStream<Never>.makeStream()
    for await _ in stream {}
    continuation.finish()
    try Task.checkCancellation()
}

/// A fresh temporary directory (the caller removes it).
func temporaryDirectory() throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-scheduler-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// Sleeps on the test clock until `deadline` (at once if the clock is already there).
func sleep(on clock: ManualClock, until deadline: WallInstant) async throws {
    try await clock.sleep(until: deadline, tolerance: nil)
}
