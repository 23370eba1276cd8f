import OrchardSupport
import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardInProcess
import OrchardProtocol
import OrchardScheduler
import Synchronization
import Testing

/// The job's background request in a scheduler persisted to SQLite (as `orchard agent --state-directory` wires
/// it): a restart keeps the request and honours its earliest begin (the coordinator's `retry_after`).
@Suite("Background training on a persistent scheduler", .serialized)
struct PersistentSchedulingTests {
    @Test("after a restart the pending request keeps its retry-after begin: nothing runs before it, the run comes after it")
    func requestSurvivesRestart() async throws {
        try await withInProcessCoordinator { coordinator, clock, directory in
            _ = try await coordinator.host(Fixture.host(goal: 1, overSelection: 1))
            // Another device holds the cycle's only place, so this device's request is turned away with a retry-after.
            let other = try await coordinator.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1, 0)))
            _ = try await coordinator.requestCycle(
                CycleRequest(workerID: other.workerID, processName: "regressor", processVersion: SemanticVersion(1, 0)),
                session: try await coordinator.session(forToken: other.sessionToken)
            )
            let storePath = directory.appendingPathComponent("agent-scheduler.sqlite").path
            let dataset = try Fixture.dataset()
            let outcomes = Mutex<[Result<CycleOutcome, OrchardClientError>]>([])

            /// One life of the device: a scheduler on its own manual clock, starting at the coordinator's date, over the
            /// store file.
            func boot(options: BackgroundTrainingOptions) async throws -> BackgroundScheduler {
                let scheduler = try BackgroundScheduler(
                    configuration: SchedulerConfiguration(permittedIdentifiers: ["train"]), clock: ManualClock(date: clock.date),
                    conditions: ScriptedConditionsProvider(.ideal), store: try SQLiteSchedulerStore(path: storePath)
                )
                let client = CoordinatorConnection(
                    transport: InProcessTransport(coordinator: coordinator), server: "in-process",
                    configuration: inMemoryConfiguration(directory, device: "a", clock: clock)
                )
                try await client.newJob(processName: "regressor", version: "1.0").scheduleBackgroundTraining(on: scheduler, options: options, data: { dataset })
                { result in
                    outcomes.withLock { $0.append(result) }
                }
                await scheduler.start()
                return scheduler
            }
            let options = BackgroundTrainingOptions(identifier: "train")

            // First life: the request runs at once, is rejected, and is resubmitted for the retry-after.
            let first = try await boot(options: options)
            #expect(await first.pendingRequests().first?.earliestBeginDate == nil)
            let ran = try await first.runWindow(budget: .seconds(600))
            #expect(ran.runs.map(\.outcome) == [.succeeded])
            guard case .success(.rejected(let retryAfter, _)) = try #require(outcomes.withLock { $0.last }) else {
                Issue.record("expected a rejection, got \(String(describing: outcomes.withLock { $0.last }))")
                return
            }
            #expect(retryAfter > 0)
            let begin = clock.date.addingTimeInterval(retryAfter)
            let submitted = try #require(await first.pendingTasks().first)
            #expect(submitted.request.earliestBeginDate == begin)

            // Second life, 10 s later: the store gives the request back with its begin date, and the job keeps it as is.
            clock.advance(bySeconds: 10)
            let second = try await boot(options: options)
            #expect(await second.pendingTasks() == [submitted])
            let early = try await second.runWindow(budget: .seconds(600))
            #expect(early.runs.isEmpty)
            #expect(early.deferred["train"] == .notDue(until: begin))
            #expect(outcomes.withLock { $0.count } == 1)

            // Third life with another priority: the request is resubmitted, still for the same begin date.
            let third = try await boot(options: BackgroundTrainingOptions(identifier: "train", priority: .high))
            let changed = try #require(await third.pendingRequests().first)
            #expect(changed.priority == .high)
            #expect(changed.earliestBeginDate == begin)
            #expect(try await third.runWindow(budget: .seconds(600)).runs.isEmpty)

            // Once the retry-after has passed, the request runs.
            clock.advance(bySeconds: retryAfter)
            let fourth = try await boot(options: options)
            let due = try await fourth.runWindow(budget: .seconds(600))
            #expect(due.runs.map(\.identifier) == ["train"])
            #expect(outcomes.withLock { $0.count } == 2)
        }
    }
}
