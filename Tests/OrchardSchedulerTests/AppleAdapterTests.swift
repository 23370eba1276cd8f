// Runs where the adapter is built against the shim (Linux, macOS); on iOS the adapter uses the real framework.
#if !canImport(BackgroundTasks)
import BackgroundTasksShim
import OrchardSupport
import Foundation
import OrchardScheduler
import OrchardSchedulerApple
import Testing

@Suite("Apple adapter (against the BackgroundTasks shim)", .timeLimit(.minutes(1)))
struct AppleAdapterTests {
    let now = Date(timeIntervalSince1970: 1_700_000_000)

    func adapter(_ system: BGTaskScheduler) -> AppleBackgroundScheduler {
        AppleBackgroundScheduler(scheduler: system, clock: ManualClock(date: now))
    }

    @Test func requestsMapToBGTaskRequests() throws {
        let begin = now.addingTimeInterval(90)
        let refresh = try AppleBackgroundScheduler.systemRequest(for: .appRefresh("r", earliestBeginDate: begin))
        #expect(refresh is BGAppRefreshTaskRequest)
        #expect(refresh.earliestBeginDate == begin)
        let processing = try #require(try AppleBackgroundScheduler.systemRequest(for: .processing("p", constraints: .powerAndNetwork)) as? BGProcessingTaskRequest)
        #expect(processing.requiresExternalPower)
        #expect(processing.requiresNetworkConnectivity)
        do {
            _ = try AppleBackgroundScheduler.systemRequest(for: .processing("p", constraints: TaskConstraints(requiresUnmeteredNetwork: true)))
            Issue.record("unmetered must be unsupported")
        } catch { #expect(error.code == .unsupported) }
        #expect(throws: SchedulerError.self) {
            try AppleBackgroundScheduler.systemRequest(for: .processing("p", constraints: TaskConstraints(requiresBatteryNotLow: true)))
        }
        #expect(try AppleBackgroundScheduler.systemRequest(for: .processing("p", constraints: TaskConstraints(requiresExternalPower: true, requiresDeviceIdle: true, requiresBatteryNotLow: true))) is BGProcessingTaskRequest)
    }

    @Test func systemErrorsMapToSchedulerErrors() async throws {
        let system = BGTaskScheduler(permittedIdentifiers: ["a", "b"])
        let apple = adapter(system)
        do {
            try await apple.register(identifier: "x") { _ in }
            Issue.record("unpermitted registration must throw")
        } catch { #expect(error.code == .notPermitted) }
        do {
            try await apple.submit(.appRefresh("x"))
            Issue.record("unpermitted submit must throw")
        } catch { #expect(error.code == .notPermitted) }
        try await apple.submit(.appRefresh("a"))
        do {
            try await apple.submit(.appRefresh("b"))
            Issue.record("second refresh must throw")
        } catch { #expect(error.code == .tooManyPendingRequests) }
    }

    @Test func pendingCancelAndCancelAllForward() async throws {
        let system = BGTaskScheduler(permittedIdentifiers: nil)
        let apple = adapter(system)
        var request = TaskRequest.processing("train", constraints: .powerAndNetwork, priority: .high)
        request.repeatInterval = .seconds(3600)
        try await apple.submit(request)
        try await apple.submit(.appRefresh("refresh"))
        #expect(await apple.pendingRequests() == [TaskRequest.appRefresh("refresh"), request].sorted { $0.identifier < $1.identifier })
        await apple.cancel(identifier: "refresh")
        #expect(await system.pendingTaskRequests().map(\.identifier) == ["train"])
        await apple.cancelAll()
        #expect(await system.pendingTaskRequests().isEmpty)
    }

    @Test func aLaunchRunsTheHandlerAndForwardsCompletion() async throws {
        let system = BGTaskScheduler(permittedIdentifiers: nil)
        let apple = adapter(system)
        let done = Signal()
        try await apple.register(identifier: "train") { task in
            #expect(task.kind == .processing)
            task.setTaskCompleted(success: true)
            done.raise()
        }
        var request = TaskRequest.processing("train", constraints: .powerAndNetwork)
        request.repeatInterval = .seconds(3600)
        try await apple.submit(request)
        let launched = try #require(system.simulateLaunch(forTaskWithIdentifier: "train"))
        #expect(launched is BGProcessingTask)
        await done.wait()
        #expect(launched.simulatedCompletion == true)
        // Repeating work was re-submitted an interval after the run.
        let pending = await system.pendingTaskRequests()
        #expect(pending.map(\.identifier) == ["train"])
        #expect(pending.first?.earliestBeginDate == now.addingTimeInterval(3600))
    }

    @Test func identifiersRegisteredAtLaunchRunTheHandlerAttachedLater() async throws {
        let system = BGTaskScheduler(permittedIdentifiers: ["train", "other"])
        let apple = adapter(system)
        // iOS: registered synchronously before the app finishes launching; the work is attached asynchronously.
        try apple.registerAtLaunch(["train"])
        #expect(throws: SchedulerError.self) { try apple.registerAtLaunch(["not-in-info-plist"]) }
        try await apple.submit(.processing("train", constraints: .powerAndNetwork))
        // The system launches the task before the handler is attached: it waits.
        let early = try #require(system.simulateLaunch(forTaskWithIdentifier: "train"))
        #expect(early.simulatedCompletion == nil)
        let runs = Counter()
        let done = Signal()
        try await apple.register(identifier: "train") { task in
            runs.increment()
            task.setTaskCompleted(success: true)
            done.raise()
        }
        await done.wait()
        #expect(early.simulatedCompletion == true && runs.value == 1)
        // Later launches run the attached handler at once.
        let again = Signal()
        try await apple.register(identifier: "train") { task in
            task.setTaskCompleted(success: true)
            again.raise()
        }
        try await apple.submit(.processing("train", constraints: .powerAndNetwork))
        let later = try #require(system.simulateLaunch(forTaskWithIdentifier: "train"))
        await again.wait()
        #expect(later.simulatedCompletion == true && runs.value == 1, "the re-attached handler ran, not the first")
    }

    @Test func aTaskLaunchedBeforeItsHandlerThatExpiresCompletesUnsuccessfully() async throws {
        let system = BGTaskScheduler(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["train"])
        try await apple.submit(.processing("train", constraints: .powerAndNetwork))
        let launched = try #require(system.simulateLaunch(forTaskWithIdentifier: "train"))
        launched.simulateExpiration()
        #expect(launched.simulatedCompletion == false)
        // A handler attached afterwards does not run the expired task.
        let ran = Counter()
        try await apple.register(identifier: "train") { task in
            ran.increment()
            task.setTaskCompleted(success: true)
        }
        #expect(ran.value == 0)
    }

    @Test func systemExpiryCancelsTheHandlersSwiftTask() async throws {
        let system = BGTaskScheduler(permittedIdentifiers: nil)
        let apple = adapter(system)
        let started = Signal()
        let finished = Signal()
        let expirations = Counter()
        try await apple.register(identifier: "refresh") { task in
            task.expirationHandler = { expirations.increment() }
            started.raise()
            do {
                try await waitForCancellation()
            } catch {
                #expect(task.expirationReason == .system)
                task.setTaskCompleted(success: true)  // too late: recorded as expired
                finished.raise()
                throw error
            }
        }
        try await apple.submit(.appRefresh("refresh"))
        let launched = try #require(system.simulateLaunch(forTaskWithIdentifier: "refresh"))
        await started.wait()
        launched.simulateExpiration()
        await finished.wait()
        #expect(launched.simulatedCompletion == false)
        #expect(expirations.value == 1)
        // A failed run is re-submitted after the first backoff step.
        #expect(await system.pendingTaskRequests().first?.earliestBeginDate == now.addingTimeInterval(30))
    }
}
#endif
