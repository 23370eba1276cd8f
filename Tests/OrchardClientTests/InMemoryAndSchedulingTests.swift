import Foundation
import OrchardSupport
import OrchardClient
import OrchardCoordinator
import OrchardFormats
import OrchardInProcess
import OrchardML
import OrchardProtocol
import OrchardScheduler
import Synchronization
import OrchardTesting
import Testing

/// A coordinator core without HTTP, on a real SQLite file, for the in-memory transport.
func withInProcessCoordinator(_ body: (Coordinator, ManualClock, URL) async throws -> Void) async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-inmemory-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let clock = ManualClock()
    let instance = try await CoordinatorInstance.open(database: directory.appendingPathComponent("c.sqlite").path, clock: clock, random: SplitMix64(seed: 3))
    try await body(instance.coordinator, clock, directory)
}

func inMemoryConfiguration(_ directory: URL, device: String, clock: ManualClock, trainer: any LocalTrainer = EngineLocalTrainer()) -> DeviceConfiguration {
    DeviceConfiguration(
        storageDirectory: directory.appendingPathComponent(device), retry: RequestRetryPolicy(maximumAttempts: 2),
        environment: .seeded(1, clock: RecordingClock(base: clock)), trainingSeed: 42, trainer: trainer
    )
}

/// A scheduler double: records registrations and submissions; the test launches runs itself.
actor RecordingScheduler: BackgroundTaskScheduling {
    var handlers: [String: BackgroundTaskHandler] = [:]
    var submitted: [TaskRequest] = []

    func register(identifier: String, handler: @escaping BackgroundTaskHandler) throws(SchedulerError) {
        handlers[identifier] = handler
    }
    func submit(_ request: TaskRequest) throws(SchedulerError) { submitted.append(request) }
    func cancel(identifier: String) {}
    func cancelAll() {}
    func pendingRequests() -> [TaskRequest] { submitted }
}

@Suite("In-memory transport and scheduler glue", .serialized)
struct InMemoryAndSchedulingTests {
    @Test("the in-memory transport runs the same cycle as HTTP and reports the same diff")
    func inMemoryCycle() async throws {
        try await withInProcessCoordinator { coordinator, clock, directory in
            let config = ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 3)
            let process = try await coordinator.host(Fixture.host(clientConfig: config))
            let transport = RecordingTransport(InProcessTransport(coordinator: coordinator))
            let client = CoordinatorConnection(
                transport: transport, server: "in-process", configuration: inMemoryConfiguration(directory, device: "a", clock: clock))
            let outcome = try await client.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset())
            guard case .reported(let receipt) = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(receipt.reportsReceived == 1)
            let reported = try diffOf(try #require(transport.log.withLock { $0.reports.first }))
            #expect(reported == (try referenceDiff(clientConfig: config, seed: 42 &+ 1)))
            #expect(try await coordinator.status(processID: process.processID).currentCycle?.reported == 1)
        }
    }

    @Test("unsynced storage writes the same state, atomically, and leaves no temporary files", arguments: [StorageDurability.synced, .unsynced])
    func storageDurability(_ durability: StorageDurability) async throws {
        try await withInProcessCoordinator { coordinator, clock, directory in
            let config = ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 1)
            _ = try await coordinator.host(Fixture.host(clientConfig: config))
            var configuration = inMemoryConfiguration(directory, device: "d", clock: clock)
            configuration.durability = durability
            let client = CoordinatorConnection(transport: InProcessTransport(coordinator: coordinator), server: "in-process", configuration: configuration)
            let job = try client.newJob(processName: "regressor", version: "1.0")
            guard case .reported = try await job.train(on: Fixture.dataset()) else {
                Issue.record("expected a report")
                return
            }
            let files = try FileManager.default.contentsOfDirectory(atPath: job.directory.path).sorted()
            // The session and the verified model are kept for the next cycle; the report is gone once accepted.
            #expect(files.contains("session.json") && files.contains("model.safetensors") && files.contains("model.json"))
            #expect(!files.contains("pending-report.safetensors"))
            #expect(files.allSatisfy { !$0.hasPrefix(".") }, "temporary files left behind: \(files)")
        }
    }

    @Test("in-memory downloads honour ranges only for the same entity")
    func inMemoryRanges() async throws {
        try await withInProcessCoordinator { coordinator, _, _ in
            _ = try await coordinator.host(Fixture.host())
            let device = try await coordinator.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1, 0)))
            guard
                case .accepted(let assignment) = try await coordinator.requestCycle(
                    CycleRequest(workerID: device.workerID, processName: "regressor", processVersion: SemanticVersion(1, 0)),
                    session: await coordinator.session(forToken: device.sessionToken)
                )
            else {
                Issue.record("not admitted")
                return
            }
            let transport = InProcessTransport(coordinator: coordinator)
            final class Collect: DownloadSink {
                let heads = Mutex<[DownloadHead]>([])
                let bytes = Mutex<[UInt8]>([])
                func begin(_ head: DownloadHead) throws(OrchardClientError) { heads.withLock { $0.append(head) } }
                func append(_ chunk: [UInt8]) throws(OrchardClientError) { bytes.withLock { $0 += chunk } }
            }
            let whole = Collect()
            try await transport.downloadModel(
                ModelRequest(modelID: assignment.modelID, requestKey: assignment.requestKey), session: device.sessionToken, into: whole)
            let all = whole.bytes.withLock { $0 }
            let etag = try #require(whole.heads.withLock { $0.first?.etag })

            let resumed = Collect()
            try await transport.downloadModel(
                ModelRequest(modelID: assignment.modelID, requestKey: assignment.requestKey, offset: 50, etag: etag), session: device.sessionToken,
                into: resumed)
            #expect(resumed.heads.withLock { $0.first?.start } == 50)
            #expect(resumed.bytes.withLock { $0 } == Array(all[50...]))

            let changed = Collect()
            try await transport.downloadModel(
                ModelRequest(modelID: assignment.modelID, requestKey: assignment.requestKey, offset: 50, etag: "\"other\""), session: device.sessionToken,
                into: changed)
            #expect(changed.heads.withLock { $0.first?.start } == 0)
            #expect(changed.bytes.withLock { $0 } == all)
        }
    }

    @Test("background glue: registered as a power-and-network processing task; expiry cancels and checkpoints; rejection reschedules at retry-after")
    func backgroundGlue() async throws {
        try await withInProcessCoordinator { coordinator, clock, directory in
            _ = try await coordinator.host(Fixture.host(goal: 1, overSelection: 1))
            let scheduler = RecordingScheduler()
            let outcomes = Mutex<[Result<CycleOutcome, OrchardClientError>]>([])
            let configuration = inMemoryConfiguration(directory, device: "a", clock: clock, trainer: InterruptingTrainer(cancelAfterUpdates: 4))
            let client = CoordinatorConnection(transport: InProcessTransport(coordinator: coordinator), server: "in-process", configuration: configuration)
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let dataset = try Fixture.dataset()
            try await job.scheduleBackgroundTraining(on: scheduler, options: BackgroundTrainingOptions(identifier: "train"), data: { dataset }) { result in
                outcomes.withLock { $0.append(result) }
            }
            let first = try #require(await scheduler.submitted.first)
            #expect(first.kind == .processing)
            #expect(first.constraints == .powerAndNetwork)
            #expect(first.earliestBeginDate == nil)
            let handler = try #require(await scheduler.handlers["train"])

            // A window whose training is interrupted (as expiry cancels the task): completes unsuccessfully.
            let run = TaskRun(task: BackgroundTask(identifier: "train", kind: .processing, timeLimit: .seconds(60)), handler: handler)
            let completion = try #require(await run.waitForCompletion())
            #expect(completion.success == false)
            #expect(FileManager.default.fileExists(atPath: job.directory.appendingPathComponent("training-checkpoint.bin").path))
            #expect(await scheduler.submitted.count == 1)
            guard case .failure(let error) = try #require(outcomes.withLock { $0.last }) else {
                Issue.record("expected the interrupted run to fail")
                return
            }
            #expect(error.code == .cancelled)

            // Another device now holds the only place; this device's next run is rejected and rescheduled.
            let other = try await coordinator.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1, 0)))
            clock.advance(bySeconds: 3601)
            await coordinator.tick()
            await coordinator.tick()
            _ = try await coordinator.requestCycle(
                CycleRequest(workerID: other.workerID, processName: "regressor", processVersion: SemanticVersion(1, 0)),
                session: await coordinator.session(forToken: other.sessionToken))
            let second = TaskRun(task: BackgroundTask(identifier: "train", kind: .processing, timeLimit: .seconds(60)), handler: handler)
            let secondCompletion = try #require(await second.waitForCompletion())
            #expect(secondCompletion.success)
            guard case .success(.rejected(let retryAfter, _)) = try #require(outcomes.withLock { $0.last }) else {
                Issue.record("expected a rejection, got \(String(describing: outcomes.withLock { $0.last }))")
                return
            }
            let resubmitted = try #require(await scheduler.submitted.last)
            #expect(await scheduler.submitted.count == 2)
            #expect(resubmitted.earliestBeginDate == clock.date.addingTimeInterval(retryAfter))
            #expect(resubmitted.constraints == .powerAndNetwork)
        }
    }
}
