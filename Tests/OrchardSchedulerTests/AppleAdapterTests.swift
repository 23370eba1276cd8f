// The adapter as an iPhone compiles it (`import BackgroundTasks`: on Linux the shim, aliased by Package.swift), driven by
// the simulated system in AppleShimTesting. Linux only: on Apple hosts the real framework has no simulation hooks, and
// macOS has no BGTaskScheduler at all.
#if os(Linux)
import AppleShimTesting
import BackgroundTasks
import Foundation
import OrchardScheduler
import OrchardSchedulerApple
import OrchardSupport
import Testing

@Suite("Apple adapter (the BackgroundTasks code an iPhone compiles, against the simulated system)", .timeLimit(.minutes(1)))
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
        let processing = try #require(
            try AppleBackgroundScheduler.systemRequest(for: .processing("p", constraints: .powerAndNetwork)) as? BGProcessingTaskRequest)
        #expect(processing.requiresExternalPower)
        #expect(processing.requiresNetworkConnectivity)
        do {
            _ = try AppleBackgroundScheduler.systemRequest(for: .processing("p", constraints: TaskConstraints(requiresUnmeteredNetwork: true)))
            Issue.record("unmetered must be unsupported")
        } catch { #expect(error.code == .unsupported) }
        #expect(throws: SchedulerError.self) {
            try AppleBackgroundScheduler.systemRequest(for: .processing("p", constraints: TaskConstraints(requiresBatteryNotLow: true)))
        }
        #expect(
            try AppleBackgroundScheduler.systemRequest(
                for: .processing("p", constraints: TaskConstraints(requiresExternalPower: true, requiresDeviceIdle: true, requiresBatteryNotLow: true)))
                is BGProcessingTaskRequest)
    }

    @Test func systemErrorsMapToSchedulerErrors() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: ["a", "b"])
        let apple = adapter(system)
        do {
            try apple.registerAtLaunch(["x"])
            Issue.record("an identifier missing from Info.plist must be refused")
        } catch { #expect(error.code == .notPermitted) }
        do {
            try await apple.submit(.appRefresh("x"))
            Issue.record("a submit without a launch handler must throw")
        } catch { #expect(error.code == .registrationClosed) }
        try apple.registerAtLaunch(["a", "b"])
        try await apple.submit(.appRefresh("a"))
        do {
            try await apple.submit(.appRefresh("b"))
            Issue.record("second refresh must throw")
        } catch { #expect(error.code == .tooManyPendingRequests) }
        #expect(system.simulatedViolations.isEmpty)
    }

    @Test func pendingCancelAndCancelAllForward() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["train", "refresh"])
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

    // MARK: Registration, as iOS enforces it

    @Test func onlyIdentifiersRegisteredAtLaunchTakeWorkAndNothingReachesTheSystemLate() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["train"])
        system.simulateFinishLaunching()
        // Attaching work to an identifier registered at launch is fine after launch.
        try await apple.register(identifier: "train") { _ in }
        // Another identifier cannot be registered any more: the adapter refuses without calling the system, which
        // would raise ('All launch handlers must be registered before application finishes launching').
        do {
            try await apple.register(identifier: "late") { _ in }
            Issue.record("a registration after launch was accepted")
        } catch {
            #expect(error.code == .registrationClosed)
            #expect(error.message.contains("registerAtLaunch"))
        }
        #expect(system.simulatedViolations.isEmpty, "\(system.simulatedViolations)")
    }

    @Test func aSubmitWithoutALaunchHandlerIsRefusedBeforeTheSystemSeesIt() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["train"])
        system.simulateFinishLaunching()
        do {
            try await apple.submit(.processing("never-registered"))
            Issue.record("a submit without a launch handler was accepted")
        } catch {
            #expect(error.code == .registrationClosed)
        }
        #expect(system.simulatedViolations.isEmpty, "the system never saw the submit, which ends a real app")
        #expect(await system.pendingTaskRequests().isEmpty)
        try await apple.submit(.processing("train"))
        #expect(await system.pendingTaskRequests().map(\.identifier) == ["train"])
    }

    @Test func aSecondRegistrationAtLaunchIsRefusedBeforeTheSystemSeesIt() throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["train"])
        do {
            try apple.registerAtLaunch(["train"])
            Issue.record("a duplicate registration was accepted")
        } catch { #expect(error.code == .alreadyRegistered) }
        #expect(system.simulatedViolations.isEmpty, "the system never saw the duplicate, which ends a real app")
    }

    @Test func theSimulatedSystemCatchesLateDuplicateAndHandlerlessLaunches() {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: ["a", "b", "c"])
        #expect(system.register(forTaskWithIdentifier: "a", using: nil) { _ in })
        #expect(!system.register(forTaskWithIdentifier: "a", using: nil) { _ in })
        #expect(!system.register(forTaskWithIdentifier: "not-in-info-plist", using: nil) { _ in })
        system.simulateFinishLaunching()
        #expect(!system.register(forTaskWithIdentifier: "b", using: nil) { _ in })
        // A submit for an identifier without a launch handler raises (and so never becomes pending).
        try? system.submit(BGProcessingTaskRequest(identifier: "c"))
        #expect(system.simulateLaunch(forTaskWithIdentifier: "c") == nil)
        let violations = system.simulatedViolations
        #expect(violations.count == 3, "\(violations)")
        #expect(violations[0].contains("has already been registered"))
        #expect(violations[1].contains("must be registered before application finishes launching"))
        #expect(violations[2].contains("No launch handler registered"))
    }

    @Test func aLateRegistrationEndsTheAppAsOnAPhone() async {
        await #expect(processExitsWith: .failure) {
            let system = BGTaskScheduler.simulated(permittedIdentifiers: nil, violations: .trap)
            system.simulateFinishLaunching()
            _ = system.register(forTaskWithIdentifier: "late", using: nil) { _ in }
        }
    }

    // MARK: Launches, completion and expiry

    @Test func aLaunchRunsTheHandlerAndSubmitsTheNextRunBeforeTheAppIsSuspended() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["train"])
        system.simulateFinishLaunching()
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
        // The last task completed: the app is suspended, and the repeat reached the system before that.
        #expect(system.isSimulatedAppSuspended)
        let pending = await system.pendingTaskRequests()
        #expect(pending.map(\.identifier) == ["train"])
        #expect(pending.first?.earliestBeginDate == now.addingTimeInterval(3600))
        #expect(system.simulatedViolations.isEmpty, "\(system.simulatedViolations)")
    }

    @Test func identifiersRegisteredAtLaunchRunTheHandlerAttachedLater() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: ["train", "other"])
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
        system.simulateForeground(true)
        let again = Signal()
        try await apple.register(identifier: "train") { task in
            task.setTaskCompleted(success: true)
            again.raise()
        }
        try await apple.submit(.processing("train", constraints: .powerAndNetwork))
        let later = try #require(system.simulateLaunch(forTaskWithIdentifier: "train"))
        await again.wait()
        #expect(later.simulatedCompletion == true && runs.value == 1, "the re-attached handler ran, not the first")
        #expect(system.simulatedViolations.isEmpty, "\(system.simulatedViolations)")
    }

    @Test func aTaskLaunchedBeforeItsHandlerThatExpiresCompletesUnsuccessfullyAndIsRetried() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["train"])
        try await apple.submit(.processing("train", constraints: .powerAndNetwork))
        let launched = try #require(system.simulateLaunch(forTaskWithIdentifier: "train"))
        launched.simulateExpiration()
        #expect(launched.simulatedCompletion == false)
        #expect(!system.isSimulatedAppTerminated)
        #expect(await system.pendingTaskRequests().first?.earliestBeginDate == now.addingTimeInterval(30), "retried with the first backoff step")
        // A handler attached afterwards does not run the expired task: it runs once, for the next launch only.
        let ran = Counter()
        try await apple.register(identifier: "train") { task in
            ran.increment()
            task.setTaskCompleted(success: true)
        }
        system.simulateForeground(true)
        let next = try #require(system.simulateLaunch(forTaskWithIdentifier: "train"))
        #expect(await next.waitForCompletion() == true)
        #expect(ran.value == 1)
        #expect(system.simulatedViolations.isEmpty, "\(system.simulatedViolations)")
    }

    /// A request pending from an earlier run of the app (this process never submitted it): when its launch fails, the
    /// retry is submitted all the same. The system removed the request at launch, so without it nothing would be pending
    /// and training would stop until the app next scheduled it.
    @Test func aFailedLaunchOfARequestFromAnEarlierRunIsRetried() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["train"])
        // Submitted to the system behind the adapter's back: as an earlier run of the app left it, unknown to this one.
        let earlier = BGProcessingTaskRequest(identifier: "train")
        earlier.requiresNetworkConnectivity = true
        try system.submit(earlier)
        try await apple.register(identifier: "train") { task in task.setTaskCompleted(success: false) }
        let launched = try #require(system.simulateLaunch(forTaskWithIdentifier: "train"))
        #expect(await launched.waitForCompletion() == false)
        let retry = try #require(await system.pendingTaskRequests().first)
        #expect(retry.identifier == "train" && retry.earliestBeginDate == now.addingTimeInterval(30), "retried with the first backoff step")
        #expect(system.simulatedViolations.isEmpty, "\(system.simulatedViolations)")
    }

    @Test func expiryCompletesTheTaskAtOnceWhileTheHandlerIsStillUnwinding() async throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        let apple = adapter(system)
        try apple.registerAtLaunch(["refresh"])
        let started = Signal()
        let release = Signal()
        let finished = Signal()
        let expirations = Counter()
        try await apple.register(identifier: "refresh") { task in
            task.expirationHandler = { expirations.increment() }
            started.raise()
            // A handler slow to notice the cancellation: it only unwinds when the test lets it.
            await release.wait()
            #expect(task.expirationReason == .system)
            task.setTaskCompleted(success: true)  // too late: the run already ended as expired
            finished.raise()
        }
        try await apple.submit(.appRefresh("refresh"))
        let launched = try #require(system.simulateLaunch(forTaskWithIdentifier: "refresh"))
        await started.wait()
        launched.simulateExpiration()
        // Completed by the time the system's expiration handler returned: the app is not terminated.
        #expect(launched.simulatedCompletion == false)
        #expect(!system.isSimulatedAppTerminated)
        #expect(expirations.value == 1)
        #expect(!launched.hasExpirationHandler, "the expiration handler is cleared once it ran")
        // The retry reached the system before the completion (the app is suspended now).
        #expect(system.isSimulatedAppSuspended)
        #expect(await system.pendingTaskRequests().first?.earliestBeginDate == now.addingTimeInterval(30))
        release.raise()
        await finished.wait()
        #expect(launched.simulatedCompletion == false)
        #expect(system.simulatedViolations.isEmpty, "\(system.simulatedViolations)")
    }

    // MARK: The simulated system's own rules

    @Test func anExpirationHandlerRunsOnceAndAnIncompleteTaskGetsTheAppTerminated() throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        _ = system.register(forTaskWithIdentifier: "t", using: nil) { _ in }
        try system.submit(BGAppRefreshTaskRequest(identifier: "t"))
        let task = try #require(system.simulateLaunch(forTaskWithIdentifier: "t"))
        var calls = 0
        task.expirationHandler = { calls += 1 }
        task.simulateExpiration()
        task.simulateExpiration()
        #expect(calls == 1)
        #expect(!task.hasExpirationHandler)
        #expect(system.isSimulatedAppTerminated)
        #expect(task.simulatedCompletion == false)
        #expect(system.simulatedViolations.contains { $0.contains("not completed when its expiration handler returned") })
    }

    @Test func aTaskWithoutAnExpirationHandlerIsCompletedUnsuccessfullyAtExpiry() throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        _ = system.register(forTaskWithIdentifier: "t", using: nil) { _ in }
        try system.submit(BGAppRefreshTaskRequest(identifier: "t"))
        let task = try #require(system.simulateLaunch(forTaskWithIdentifier: "t"))
        task.simulateExpiration()
        #expect(task.simulatedCompletion == false)
        #expect(!system.isSimulatedAppTerminated)
        #expect(system.simulatedViolations.isEmpty)
    }

    @Test func completingATaskReleasesItsExpirationHandler() throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        _ = system.register(forTaskWithIdentifier: "t", using: nil) { _ in }
        try system.submit(BGAppRefreshTaskRequest(identifier: "t"))
        let task = try #require(system.simulateLaunch(forTaskWithIdentifier: "t"))
        task.expirationHandler = {}
        task.setTaskCompleted(success: true)
        #expect(!task.hasExpirationHandler)
    }

    @Test func workAfterTheLastCompletionDoesNotHappen() throws {
        let system = BGTaskScheduler.simulated(permittedIdentifiers: nil)
        _ = system.register(forTaskWithIdentifier: "t", using: nil) { _ in }
        system.simulateFinishLaunching()
        try system.submit(BGAppRefreshTaskRequest(identifier: "t"))
        let task = try #require(system.simulateLaunch(forTaskWithIdentifier: "t"))
        task.setTaskCompleted(success: true)
        #expect(system.isSimulatedAppSuspended)
        try system.submit(BGAppRefreshTaskRequest(identifier: "t"))
        #expect(system.simulatedViolations == ["submit(t) while the app was suspended: it does not reach the system"])
        // In the foreground the app is not suspended.
        system.simulateForeground(true)
        try system.submit(BGAppRefreshTaskRequest(identifier: "t"))
        #expect(system.simulatedViolations.count == 1)
    }
}
#endif
