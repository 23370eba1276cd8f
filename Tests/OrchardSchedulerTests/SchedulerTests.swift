import OrchardSupport
import Foundation
import OrchardScheduler
import Testing

@Suite("Background scheduler", .timeLimit(.minutes(3)))  // a hang guard: the full suite runs CPU-heavy tests beside it
struct SchedulerTests {
    // MARK: Registration and submission

    @Test func registrationErrorsMirrorIOS() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["a"])
        await #expect(throws: SchedulerError.self) { try await scheduler.register(identifier: "nope") { _ in } }
        do { try await scheduler.register(identifier: "nope") { _ in } } catch { #expect(error.code == .notPermitted) }
        try await scheduler.register(identifier: "a") { _ in }
        do {
            try await scheduler.register(identifier: "a") { _ in }
            Issue.record("registering twice must throw")
        } catch { #expect(error.code == .alreadyRegistered) }
        let late = try makeScheduler(clock: clock, permitted: ["a"])
        await late.start()
        do {
            try await late.register(identifier: "a") { _ in }
            Issue.record("registering after start must throw")
        } catch { #expect(error.code == .registrationClosed) }
    }

    @Test func submitValidatesAndEnforcesLimits() async throws {
        let ids = Set(["r1", "r2"] + (0...10).map { "p\($0)" })
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ids)
        do {
            try await scheduler.submit(.appRefresh("unlisted"))
            Issue.record("unlisted identifier must throw")
        } catch { #expect(error.code == .notPermitted) }
        do {
            try await scheduler.submit(TaskRequest(identifier: "r1", kind: .appRefresh, constraints: .powerAndNetwork))
            Issue.record("constraints on a refresh must throw")
        } catch { #expect(error.code == .invalidRequest) }
        do {
            try await scheduler.submit(TaskRequest(identifier: "p0", kind: .processing, timeout: .seconds(301)))
            Issue.record("a timeout past the kind budget must throw")
        } catch { #expect(error.code == .invalidRequest) }

        try await scheduler.submit(.appRefresh("r1", earliestBeginDate: startDate))
        do {
            try await scheduler.submit(.appRefresh("r2"))
            Issue.record("a second refresh must throw")
        } catch { #expect(error.code == .tooManyPendingRequests) }
        // Same identifier replaces.
        let later = startDate.addingTimeInterval(600)
        try await scheduler.submit(.appRefresh("r1", earliestBeginDate: later))
        #expect(await scheduler.pendingRequests().filter { $0.kind == .appRefresh }.map(\.earliestBeginDate) == [later])

        for i in 0..<10 { try await scheduler.submit(.processing("p\(i)")) }
        do {
            try await scheduler.submit(.processing("p10"))
            Issue.record("an eleventh processing request must throw")
        } catch { #expect(error.code == .tooManyPendingRequests) }
        try await scheduler.submit(.processing("p3", constraints: .powerAndNetwork))
        #expect(await scheduler.pendingRequests().count == 11)

        await scheduler.cancel(identifier: "p3")
        #expect(await scheduler.pendingRequests().count == 10)
        try await scheduler.submit(.processing("p10"))
        await scheduler.cancelAll()
        #expect(await scheduler.pendingRequests().isEmpty)
    }

    @Test func limitsAreConfigurable() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["a", "b", "c"]) { $0.maxPendingProcessing = 2 }
        try await scheduler.submit(.processing("a"))
        try await scheduler.submit(.processing("b"))
        await #expect(throws: SchedulerError.self) { try await scheduler.submit(.processing("c")) }
    }

    // MARK: Eligibility

    @Test func earliestBeginIsRespected() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["a"])
        let runs = Counter()
        try await scheduler.register(identifier: "a") { _ in runs.increment() }
        try await scheduler.submit(.processing("a", earliestBeginDate: startDate.addingTimeInterval(60)))

        var report = try await scheduler.runWindow(budget: .seconds(30))
        #expect(report.runs.isEmpty)
        #expect(report.deferred["a"]?.isWaitingForTime == true)
        await clock.step(by: .seconds(59))
        report = try await scheduler.runWindow(budget: .seconds(30))
        #expect(report.runs.isEmpty)
        await clock.step(by: .seconds(1))
        report = try await scheduler.runWindow(budget: .seconds(30))
        #expect(report.runs.map(\.outcome) == [.succeeded])
        #expect(runs.value == 1)
        #expect(await scheduler.pendingRequests().isEmpty)
    }

    @Test func constraintsGateAndUngate() async throws {
        let clock = testClock()
        let conditions = ScriptedConditionsProvider(.ideal)
        conditions.update {
            $0.onExternalPower = false; $0.batteryCharging = false
        }
        let scheduler = try makeScheduler(clock: clock, permitted: ["train"], conditions: conditions)
        let runs = Counter()
        try await scheduler.register(identifier: "train") { _ in runs.increment() }
        try await scheduler.submit(.processing("train", constraints: .powerAndNetwork))

        var report = try await scheduler.runWindow(budget: .seconds(60))
        #expect(report.runs.isEmpty)
        #expect(report.deferred["train"]?.unmetConstraints == [UnmetConstraint(.externalPower)])

        conditions.update {
            $0.onExternalPower = true; $0.networkConnected = nil
        }
        report = try await scheduler.runWindow(budget: .seconds(60))
        #expect(report.deferred["train"]?.unmetConstraints == [UnmetConstraint(.networkConnectivity, becauseUnknown: true)])

        conditions.set(.ideal)
        report = try await scheduler.runWindow(budget: .seconds(60))
        #expect(report.runs.map(\.identifier) == ["train"])
        #expect(runs.value == 1)
    }

    @Test func unregisteredTasksWait() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["a"])
        try await scheduler.submit(.processing("a"))
        let report = try await scheduler.runWindow(budget: .seconds(30))
        #expect(report.runs.isEmpty)
        #expect(report.deferred["a"] == .noHandler)
    }

    // MARK: Runs

    @Test func expiryCancelsALongHandlerAtItsNextSuspensionPoint() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["refresh"])
        let started = Signal()
        let expirations = Counter()
        let sawCancellation = Counter()
        try await scheduler.register(identifier: "refresh") { task in
            task.expirationHandler = { expirations.increment() }
            #expect(task.timeLimit == .seconds(20))
            started.raise()
            do {
                try await clock.sleep(for: .seconds(1000))
            } catch {
                sawCancellation.increment()
                #expect(task.isExpired)
                throw error
            }
        }
        try await scheduler.submit(.appRefresh("refresh"))
        let window = Task { try await scheduler.runWindow(budget: .seconds(20)) }
        await started.wait()
        await clock.step(by: .seconds(20))
        let report = try await window.value
        let run = try #require(report.runs.first)
        #expect(run.outcome == .expired)
        #expect(run.expiredBy == .timeLimit)
        #expect(run.runTime == .seconds(20))
        #expect(expirations.value == 1)
        #expect(sawCancellation.value == 1)
        // An expired run is a failed attempt: retried after the first backoff step.
        #expect(run.nextBeginDate == startDate.addingTimeInterval(20 + 30))
        #expect(await scheduler.history(for: "refresh")?.consecutiveFailures == 1)
    }

    @Test func firstSetTaskCompletedWins() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["a", "b", "c"])
        try await scheduler.register(identifier: "a") { task in
            task.setTaskCompleted(success: false)
            task.setTaskCompleted(success: true)
        }
        try await scheduler.register(identifier: "b") { task in
            task.setTaskCompleted(success: true)
            throw CancellationError()
        }
        try await scheduler.register(identifier: "c") { _ in
            struct Broken: Error {}
            throw Broken()
        }
        for id in ["a", "b", "c"] { try await scheduler.submit(.processing(id, constraints: .none)) }
        let report = try await scheduler.runWindow(budget: .seconds(60))
        let outcomes = Dictionary(uniqueKeysWithValues: report.runs.map { ($0.identifier, $0.outcome) })
        #expect(outcomes == ["a": .failed, "b": .succeeded, "c": .failed])
    }

    @Test func completingAfterExpiryIsStillExpired() {
        let task = BackgroundTask(identifier: "t", kind: .processing, timeLimit: .seconds(1))
        let calls = Counter()
        task.expirationHandler = { calls.increment() }
        #expect(task.expire(.timeLimit))
        #expect(!task.expire(.conditionsLost))
        task.setTaskCompleted(success: true)
        #expect(task.completion == TaskCompletion(success: false, expiredBy: .timeLimit))
        #expect(calls.value == 1)
        // A handler set after expiry runs at once (before completion), so late setters still learn.
        let late = BackgroundTask(identifier: "u", kind: .processing, timeLimit: .seconds(1))
        late.expire(.system)
        late.expirationHandler = { calls.increment() }
        #expect(calls.value == 2)
    }

    @Test func overrunFailsAndThrottles() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["stubborn"])
        let started = Signal()
        let gate = Gate()
        let launches = Counter()
        try await scheduler.register(identifier: "stubborn") { _ in
            launches.increment()
            started.raise()
            await gate.wait()  // ignores cancellation
        }
        try await scheduler.submit(.appRefresh("stubborn"))
        let window = Task { try await scheduler.runWindow(budget: .seconds(30)) }
        await started.wait()
        await clock.step(by: .seconds(35))  // the 30 s limit plus the 5 s grace
        let report = try await window.value
        let run = try #require(report.runs.first)
        #expect(run.outcome == .overran)
        #expect(run.runTime == .seconds(35))
        let throttle = startDate.addingTimeInterval(35 + 900)
        #expect(run.throttledUntil == throttle)
        #expect(await scheduler.history(for: "stubborn")?.throttledUntil == throttle)
        #expect(await scheduler.effectiveBeginDate(of: "stubborn") == throttle)

        // The 30 s retry is due, but the throttle holds it back.
        await clock.step(by: .seconds(60))
        var next = try await scheduler.runWindow(budget: .seconds(30))
        #expect(next.runs.isEmpty)
        #expect(next.deferred["stubborn"] == .throttled(until: throttle))
        await clock.step(by: .seconds(900))
        gate.open()
        next = try await scheduler.runWindow(budget: .seconds(30))
        #expect(next.runs.map(\.outcome) == [.succeeded])
        #expect(launches.value == 2)
        #expect(await scheduler.history(for: "stubborn")?.consecutiveOverruns == 0)
    }

    @Test func failuresBackOffExponentiallyUpToTheCapAndStopAtMaxAttempts() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["flaky"])
        try await scheduler.register(identifier: "flaky") { task in task.setTaskCompleted(success: false) }
        var request = TaskRequest.processing("flaky")
        request.retry = RetryPolicy(cap: .seconds(200), maxAttempts: 6)
        try await scheduler.submit(request)
        var delays: [Double] = []
        while true {
            let report = try await scheduler.runWindow(budget: .seconds(60))
            guard let run = report.runs.first else { Issue.record("expected a run"); return }
            #expect(run.outcome == .failed)
            guard let next = run.nextBeginDate else { break }
            delays.append(next.timeIntervalSince(scheduler.now))
            await clock.step(by: .seconds(next.timeIntervalSince(scheduler.now)))
        }
        #expect(delays == [30, 60, 120, 200, 200])
        #expect(await scheduler.pendingRequests().isEmpty)
        #expect(await scheduler.history(for: "flaky")?.failures == 6)
    }

    @Test func recurringWorkReschedulesItself() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["sync"])
        try await scheduler.register(identifier: "sync") { _ in }
        var request = TaskRequest.processing("sync")
        request.repeatInterval = .seconds(3600)
        try await scheduler.submit(request)
        for round in 0..<3 {
            let report = try await scheduler.runWindow(budget: .seconds(60))
            #expect(report.runs.map(\.outcome) == [.succeeded])
            let expected = startDate.addingTimeInterval(Double(round + 1) * 3600)
            #expect(await scheduler.pendingRequests().first?.earliestBeginDate == expected)
            #expect(try await scheduler.runWindow(budget: .seconds(60)).runs.isEmpty)
            await clock.step(by: .seconds(3600))
        }
        #expect(await scheduler.history(for: "sync")?.runs == 3)
    }

    @Test func aHandlerThatResubmitsKeepsItsOwnRequest() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["job"])
        let retryAt = startDate.addingTimeInterval(120)
        try await scheduler.register(identifier: "job") { task in
            // A server said `retry_after: 120`: reschedule, then report failure.
            try await scheduler.submit(.processing("job", earliestBeginDate: retryAt, constraints: .powerAndNetwork))
            task.setTaskCompleted(success: false)
        }
        try await scheduler.submit(.processing("job", constraints: .powerAndNetwork))
        let report = try await scheduler.runWindow(budget: .seconds(60))
        #expect(report.runs.first?.outcome == .failed)
        #expect(report.runs.first?.nextBeginDate == nil)
        #expect(await scheduler.pendingRequests().map(\.earliestBeginDate) == [retryAt])
    }

    @Test func cancellingARunningTaskPreventsItsRetry() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["job"])
        try await scheduler.register(identifier: "job") { task in
            await scheduler.cancel(identifier: "job")
            task.setTaskCompleted(success: false)
        }
        try await scheduler.submit(.processing("job"))
        let report = try await scheduler.runWindow(budget: .seconds(60))
        #expect(report.runs.first?.outcome == .failed)
        #expect(await scheduler.pendingRequests().isEmpty)
    }

    @Test func losingARequiredConditionMidRunStopsTheTaskWithoutPenalty() async throws {
        let clock = testClock()
        let conditions = ScriptedConditionsProvider(.ideal)
        let scheduler = try makeScheduler(clock: clock, permitted: ["train"], conditions: conditions)
        let started = Signal()
        let expirations = Counter()
        try await scheduler.register(identifier: "train") { task in
            task.expirationHandler = { expirations.increment() }
            started.raise()
            try await waitForCancellation()
        }
        try await scheduler.submit(.processing("train", constraints: .powerAndNetwork))
        let window = Task { try await scheduler.runWindow(budget: .seconds(300)) }
        await started.wait()
        conditions.update {
            $0.onExternalPower = false; $0.batteryCharging = false
        }
        await clock.step(by: .seconds(5))  // the first poll sees the charger unplugged
        let report = try await window.value
        let run = try #require(report.runs.first)
        #expect(run.outcome == .stopped)
        #expect(run.expiredBy == .conditionsLost)
        #expect(run.runTime == .seconds(5))
        #expect(expirations.value == 1)
        let history = try #require(await scheduler.history(for: "train"))
        #expect(history.consecutiveFailures == 0)
        #expect(history.recentRunTimes.isEmpty)
        #expect(await scheduler.pendingRequests().map(\.identifier) == ["train"])
    }

    @Test func runTimesAreMeasuredFromEachTasksOwnStart() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["first", "second"])
        let firstStarted = Signal()
        let secondStarted = Signal()
        try await scheduler.register(identifier: "first") { _ in
            let until = clock.now.advanced(by: .seconds(4))
            firstStarted.raise()
            try await sleep(on: clock, until: until)
        }
        try await scheduler.register(identifier: "second") { _ in
            let until = clock.now.advanced(by: .seconds(3))
            secondStarted.raise()
            try await sleep(on: clock, until: until)
        }
        var first = TaskRequest.processing("first", priority: .veryHigh)
        first.expectedDuration = .seconds(4)
        var second = TaskRequest.processing("second", priority: .low)
        second.expectedDuration = .seconds(3)
        try await scheduler.submit(first)
        try await scheduler.submit(second)
        let window = Task { try await scheduler.runWindow(budget: .seconds(10)) }
        await firstStarted.wait()
        await clock.step(by: .seconds(4))
        await secondStarted.wait()
        await clock.step(by: .seconds(3))
        let report = try await window.value
        #expect(report.runs.map(\.identifier) == ["first", "second"])
        #expect(report.runs.map(\.runTime) == [.seconds(4), .seconds(3)])
        #expect(await scheduler.history(for: "second")?.recentRunTimes == [.seconds(3)])
        #expect(report.used == .seconds(7))
    }

    @Test func aTaskLongerThanTheWindowDoesNotStarveForever() async throws {
        let clock = testClock()
        var history = TaskHistory(identifier: "big")
        history.recentRunTimes = [.seconds(20), .seconds(20), .seconds(20)]
        history.lastRunEnd = startDate
        let store = InMemorySchedulerStore(
            SchedulerSnapshot(
                pending: ["big": PendingTask(request: .appRefresh("big"), submittedAt: startDate)],
                histories: ["big": history]
            ))
        let scheduler = try makeScheduler(clock: clock, permitted: ["big"], store: store)
        let runs = Counter()
        try await scheduler.register(identifier: "big") { _ in runs.increment() }
        var windows = 0
        while runs.value == 0, windows < 100 {
            let report = try await scheduler.runWindow(budget: .seconds(10))
            if report.runs.isEmpty {
                #expect(report.deferred["big"]?.description.contains("does not fit") == true)
            }
            windows += 1
            await clock.step(by: .seconds(1800))
        }
        #expect(runs.value == 1)
        // Estimate 20 s halves every 6 h: it first fits a 10 s window after 6 h (12 windows, 30 min apart).
        #expect(windows == 13)
    }

    @Test func oneWindowAtATime() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["slow"])
        let started = Signal()
        try await scheduler.register(identifier: "slow") { _ in
            let until = clock.now.advanced(by: .seconds(5))
            started.raise()
            try await sleep(on: clock, until: until)
        }
        try await scheduler.submit(.processing("slow"))
        let window = Task { try await scheduler.runWindow(budget: .seconds(30)) }
        await started.wait()
        do {
            _ = try await scheduler.runWindow(budget: .seconds(30))
            Issue.record("a second concurrent window must throw")
        } catch { #expect(error.code == .windowInProgress) }
        await clock.step(by: .seconds(5))
        #expect(try await window.value.runs.count == 1)
    }

    // MARK: Persistence

    /// A finished run's history and its follow-up are one write: after it, a reopened store holds both, and a removal
    /// or an untouched request is recorded as such.
    @Test(arguments: ["sqlite", "memory"])
    func aRunsHistoryAndFollowUpAreRecordedTogether(_ kind: String) throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("scheduler.sqlite").path
        let memory = InMemorySchedulerStore()
        func store() throws -> any SchedulerStore { kind == "sqlite" ? try SQLiteSchedulerStore(path: path) : memory }
        var history = TaskHistory(identifier: "train")
        history.runs = 1
        history.consecutiveFailures = 1
        let retry = PendingTask(request: .processing("train"), submittedAt: startDate)
        try store().savePending(PendingTask(request: .processing("train"), submittedAt: startDate.addingTimeInterval(-60)))
        try store().recordRun(history, pending: .save(retry))
        var snapshot = try store().load()
        #expect(snapshot.histories["train"] == history && snapshot.pending["train"] == retry)
        history.runs = 2
        try store().recordRun(history, pending: .unchanged)
        snapshot = try store().load()
        #expect(snapshot.histories["train"]?.runs == 2 && snapshot.pending["train"] == retry)
        try store().recordRun(history, pending: .remove)
        #expect(try store().load().pending["train"] == nil)
    }

    @Test func pendingRequestsAndHistorySurviveARestart() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("scheduler.sqlite").path
        let clock = testClock()
        let later = startDate.addingTimeInterval(3600)
        do {
            let scheduler = try makeScheduler(clock: clock, permitted: ["measured", "later"], store: try SQLiteSchedulerStore(path: path))
            let started = Signal()
            try await scheduler.register(identifier: "measured") { task in
                let until = clock.now.advanced(by: .seconds(7))
                started.raise()
                try await sleep(on: clock, until: until)
                task.setTaskCompleted(success: false)
            }
            try await scheduler.submit(.processing("measured", constraints: .powerAndNetwork, priority: .high))
            try await scheduler.submit(.processing("later", earliestBeginDate: later))
            let window = Task { try await scheduler.runWindow(budget: .seconds(60)) }
            await started.wait()
            await clock.step(by: .seconds(7))
            #expect(try await window.value.runs.map(\.outcome) == [.failed])
        }

        let store = try SQLiteSchedulerStore(path: path)
        #expect(store.recovery == nil)
        let restartedClock = testClock(offset: 7)
        let restarted = try makeScheduler(clock: restartedClock, permitted: ["measured", "later"], store: store)
        let pending = await restarted.pendingRequests()
        #expect(pending.map(\.identifier) == ["later", "measured"])
        #expect(pending[0].earliestBeginDate == later)
        #expect(pending[1].earliestBeginDate == startDate.addingTimeInterval(7 + 30))
        #expect(pending[1].constraints == .powerAndNetwork)
        #expect(pending[1].priority == .high)
        let history = try #require(await restarted.history(for: "measured"))
        #expect(history.recentRunTimes == [.seconds(7)])
        #expect(history.consecutiveFailures == 1)
        #expect(history.lastOutcome == .failed)
        #expect(history.lastRunEnd == startDate.addingTimeInterval(7))
    }

    /// A process killed while a task runs (nothing after the launch is written) finds the request again at its next
    /// start; a run that ends with no follow-up, or a running task cancelled, leaves nothing stored.
    @Test func aRunCutShortByTheProcessDyingKeepsItsRequest() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("scheduler.sqlite").path
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["train", "once", "dropped"], store: try SQLiteSchedulerStore(path: path))
        let started = Signal()
        try await scheduler.register(identifier: "train") { _ in
            started.raise()
            try await sleep(on: clock, until: clock.now.advanced(by: .seconds(3600)))
        }
        try await scheduler.submit(.processing("train", priority: .high))
        let window = Task { try await scheduler.runWindow(budget: .seconds(60), kinds: [.processing]) }
        await started.wait()
        // The process dies here: what a fresh start reads from the store is what was written so far.
        #expect(try SQLiteSchedulerStore(path: path).load().pending.keys.sorted() == ["train"])
        window.cancel()
        _ = try? await window.value

        let store = try SQLiteSchedulerStore(path: path)
        try store.removePending("train")
        let other = try makeScheduler(clock: clock, permitted: ["once", "dropped"], store: store)
        try await other.register(identifier: "once") { task in task.setTaskCompleted(success: true) }
        try await other.register(identifier: "dropped") { task in
            await other.cancel(identifier: "dropped")
            task.setTaskCompleted(success: true)
        }
        try await other.submit(.processing("once"))
        try await other.submit(.processing("dropped"))
        #expect(try await other.runWindow(budget: .seconds(60)).runs.map(\.outcome) == [.succeeded, .succeeded])
        #expect(try SQLiteSchedulerStore(path: path).load().pending.isEmpty)
    }

    @Test func aCorruptStoreIsSetAsideAndReported() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("scheduler.sqlite").path
        let garbage = Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        try garbage.write(to: URL(fileURLWithPath: path))
        let store = try SQLiteSchedulerStore(path: path)
        let recovery = try #require(store.recovery)
        #expect(recovery.setAsidePath == path + ".corrupt")
        #expect(FileManager.default.contents(atPath: recovery.setAsidePath) == garbage)
        let scheduler = try makeScheduler(clock: testClock(), permitted: ["a"], store: store)
        #expect(scheduler.storeRecovery == recovery)
        #expect(await scheduler.pendingRequests().isEmpty)
        try await scheduler.submit(.processing("a"))
        #expect(try SQLiteSchedulerStore(path: path).load().pending.keys.sorted() == ["a"])

        // A second corrupt file does not overwrite the first one set aside.
        try garbage.write(to: URL(fileURLWithPath: path))
        #expect(try SQLiteSchedulerStore(path: path).recovery?.setAsidePath == path + ".corrupt-1")
    }

    @Test func anUncreatableStoreIsAnError() {
        #expect(throws: SchedulerError.self) { try SQLiteSchedulerStore(path: "/nonexistent-dir-\(UUID().uuidString)/s.sqlite") }
    }

    // MARK: Service

    @Test func theServiceRunsTasksWhenTheyBecomeDue() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["refresh"])
        try await scheduler.register(identifier: "refresh") { _ in }
        try await scheduler.submit(.appRefresh("refresh", earliestBeginDate: startDate.addingTimeInterval(45)))
        let service = Task { try await scheduler.run() }
        await clock.step(by: .seconds(45))
        while await scheduler.history(for: "refresh") == nil { await Task.yield() }
        service.cancel()
        await #expect(throws: CancellationError.self) { try await service.value }
        #expect(await scheduler.history(for: "refresh")?.lastOutcome == .succeeded)
        #expect(await scheduler.history(for: "refresh")?.lastRunStart == startDate.addingTimeInterval(45))
    }

    @Test func shutdownGivesTheRunningTaskItsGracePeriodToSaveItsWork() async throws {
        let clock = testClock()
        let scheduler = try makeScheduler(clock: clock, permitted: ["train"])
        let started = Signal()
        let expired = Signal()
        let saving = Gate()
        let saved = Counter()
        try await scheduler.register(identifier: "train") { task in
            task.expirationHandler = { expired.raise() }
            started.raise()
            try? await waitForCancellation()
            // Saving a checkpoint takes a while, and is not cut short by the cancellation that expired us.
            await saving.wait()
            saved.increment()
            task.setTaskCompleted(success: false)
        }
        try await scheduler.submit(.processing("train"))
        let service = Task { try await scheduler.run() }
        await started.wait()
        service.cancel()
        await expired.wait()
        let serviceDone = Counter()
        let finished = Task { () -> Int in
            _ = try? await service.value
            serviceDone.increment()
            return saved.value
        }
        // Ample opportunity for a scheduler that does not wait to return while the handler is still saving.
        for _ in 0..<1000 { await Task.yield() }
        #expect(serviceDone.value == 0)
        saving.open()
        // The service returns only once the handler has saved (within the grace period, which the test clock
        // never reaches).
        #expect(await finished.value == 1)
        #expect(await scheduler.history(for: "train")?.lastOutcome == .stopped)
    }
}
