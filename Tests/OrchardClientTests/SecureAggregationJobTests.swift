import Foundation
@testable import OrchardClient
import OrchardFormats
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import OrchardScheduler
import OrchardSupport
import OrchardTesting
import Synchronization
import Testing

/// A coordinator for whole device cycles in memory: authentication, a cycle assignment, a plan with secure
/// aggregation and the fixture's model; secure-aggregation steps go to a shared ``FakeSecureCoordinator``. Plain
/// reports are refused (and counted): a secure-aggregation device must never upload one.
final class SecureProcessTransport: ClientTransport {
    let plan: TrainingPlan
    let reportWithin: Double
    let coordinator: Mutex<FakeSecureCoordinator>
    let reports = Mutex(0)
    let weights: [UInt8]

    init(plan: TrainingPlan, coordinator: FakeSecureCoordinator, reportWithin: Double = 600) throws {
        self.plan = plan
        self.reportWithin = reportWithin
        self.coordinator = Mutex(coordinator)
        weights = try Fixture.initialWeights()
    }

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        // The device's credential names the worker.
        let worker = request.authToken ?? "anonymous"
        return AuthenticateResponse(workerID: worker, sessionToken: "session-\(worker)", expiresIn: 3600, requiresSpeedTest: false)
    }

    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        .accepted(
            CycleAssignment(
                requestKey: "key-\(request.workerID)", processID: SecureFixture.processID, cycle: SecureFixture.cycle, checkpoint: 1, modelID: "m1",
                planID: "p1",
                reportWithin: reportWithin
            ))
    }

    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan { plan }

    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        try sink.begin(DownloadHead(start: 0, totalLength: weights.count, etag: "\"m1\"", sha256: ModelIntegrity.sha256(weights)))
        try sink.append(weights)
    }

    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        reports.withLock { $0 += 1 }
        throw FakeSecureCoordinator.error(409, .aggregationModeMismatch, "this process uses secure aggregation")
    }

    func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        guard session == "session-\(request.workerID)" else { throw OrchardClientError.server(status: 401, body: nil) }
        await Task.yield()
        let answer = coordinator.withLock { coordinator -> Result<SecureAggregationReply, OrchardClientError> in
            do throws(OrchardClientError) {
                return .success(try coordinator.handle(request))
            } catch {
                return .failure(error)
            }
        }
        return try answer.get()
    }
}

/// Secure aggregation wired into the job: the cycle state machine's branch after training, and whole cycles of
/// ``FederatedJob`` against an in-memory coordinator.
@Suite("Secure aggregation in the job cycle")
struct SecureAggregationJobTests {
    typealias Machine = JobCycleStateMachine

    static func securePlan(maximumSampleCount: Int = 100, localPrivacy: LocalPrivacy? = nil) -> TrainingPlan {
        TrainingPlan(
            planID: "p", model: Fixture.spec, clientConfig: JobCycleStateMachineTests.config, localPrivacy: localPrivacy,
            secureAggregation: SecureFixture.plan(maximumSampleCount: maximumSampleCount)
        )
    }

    /// Drives a machine with a saved session up to its training step under `plan`.
    static func toTraining(_ machine: inout Machine, plan: TrainingPlan) throws {
        let shapes = try JobCycleStateMachineTests.shapes()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(JobCycleStateMachineTests.stored(), now: JobCycleStateMachineTests.now)
        _ = machine.cycleAnswered(.accepted(JobCycleStateMachineTests.assignment()))
        _ = machine.planDownloaded(plan, shapes: shapes)
        _ = machine.cachedModelLoaded(nil, info: nil)
        let bytes = try Fixture.initialWeights()
        _ = machine.modelDownloaded(bytes, info: JobCycleStateMachineTests.info(for: bytes))
    }

    // MARK: The state machine

    @Test("after training, a secure-aggregation plan runs the exchange instead of keeping and uploading a report")
    func machineBranch() throws {
        var machine = JobCycleStateMachineTests.machine()
        try Self.toTraining(&machine, plan: Self.securePlan())
        let update = try JobCycleStateMachineTests.update(scale: 0.02)
        let actions = machine.trainingEnded(.completed(update))
        #expect(JobCycleStateMachineTests.names(actions) == ["phase:secureAggregation", "discardCheckpoint", "secureAggregate"])
        guard case .secureAggregate(let input)? = actions.last else {
            Issue.record("expected the exchange, got \(actions)")
            return
        }
        #expect(input.update == SecureAggregationExchange.flatten(update.diff))
        #expect(input.sampleCount == 96 && input.workerID == "w1" && input.session == "t1")
        #expect(input.assignment == JobCycleStateMachineTests.assignment())
        #expect(input.waitLimit == 600 + SecureAggregationWaitLimit.defaultMargin)
        let receipt = ReportReceipt(cycle: 3, reportsReceived: nil, retryAfter: nil, fromEarlierWindow: false)
        let finished = machine.secureAggregationEnded(.reported(receipt))
        #expect(JobCycleStateMachineTests.names(finished) == ["finish"])
        #expect(JobCycleStateMachineTests.outcome(finished) == .reported(receipt))
    }

    @Test("a sample count above the plan's maximum fails the cycle before the exchange starts")
    func machineRefusesSampleCount() throws {
        var machine = JobCycleStateMachineTests.machine()
        try Self.toTraining(&machine, plan: Self.securePlan(maximumSampleCount: 50))
        let actions = machine.trainingEnded(.completed(try JobCycleStateMachineTests.update()))
        #expect(JobCycleStateMachineTests.names(actions) == ["fail:training"])
        #expect(JobCycleStateMachineTests.failure(actions)?.message.contains("96") == true)
    }

    @Test("a failed exchange fails the cycle")
    func machineFailure() throws {
        var machine = JobCycleStateMachineTests.machine()
        try Self.toTraining(&machine, plan: Self.securePlan())
        _ = machine.trainingEnded(.completed(try JobCycleStateMachineTests.update()))
        let actions = machine.secureAggregationFailed(OrchardClientError(.cancelled, "window expired"))
        #expect(JobCycleStateMachineTests.names(actions) == ["fail:cancelled"])
    }

    // MARK: Whole cycles

    /// Runs one cycle on each of `count` jobs at once; returns their outcomes (or errors), the transport and the
    /// events of job 0.
    static func runJobs(
        count: Int, plan: TrainingPlan, coordinator: FakeSecureCoordinator, configure: (inout DeviceConfiguration) -> Void = { _ in },
        update: @escaping @Sendable (Int, CycleContext) -> LocalUpdate
    ) async throws -> (outcomes: [Result<CycleOutcome, OrchardClientError>], transport: SecureProcessTransport, events: [JobEvent], directories: [URL]) {
        let transport = try SecureProcessTransport(plan: plan, coordinator: coordinator)
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-secure-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        var jobs: [FederatedJob] = []
        var directories: [URL] = []
        for i in 0..<count {
            var configuration = DeviceConfiguration(
                storageDirectory: root.appendingPathComponent("device-\(i)"), retry: RequestRetryPolicy(maximumAttempts: 3),
                environment: .seeded(UInt64(i), clock: RecordingClock(), seedNoise: true), trainingSeed: 42, durability: .unsynced
            )
            configure(&configuration)
            let client = CoordinatorConnection(transport: transport, server: "memory", authToken: "w\(i)", configuration: configuration)
            let job = try client.newJob(processName: "regressor", version: "1.0")
            jobs.append(job)
            directories.append(job.directory)
        }
        let events = jobs[0].events()
        let outcomes = await withTaskGroup(of: (Int, Result<CycleOutcome, OrchardClientError>).self) { group in
            for (i, job) in jobs.enumerated() {
                group.addTask {
                    do throws(OrchardClientError) {
                        return (i, .success(try await job.run { context in update(i, context) }))
                    } catch {
                        return (i, .failure(error))
                    }
                }
            }
            var results = [Result<CycleOutcome, OrchardClientError>?](repeating: nil, count: count)
            for await (i, result) in group { results[i] = result }
            return results.map { $0! }
        }
        var seen: [JobEvent] = []
        for await event in events {
            seen.append(event)
            if event == .phase(.finished) { break }
        }
        // Nothing about the exchange is written: no pending report, no checkpoint, only the session and the model.
        for directory in directories {
            let store = ClientStore(directory: directory, durability: .unsynced)
            #expect(try store.pendingReport() == nil)
            #expect(try store.checkpoint() == nil)
            let files = Set((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? [])
            #expect(files.isSubset(of: ["session.json", "model.safetensors", "model.json"]), "unexpected files \(files.sorted())")
        }
        return (outcomes, transport, seen, directories)
    }

    /// Device `i`'s diff: every tensor of the model, filled with a value per device and tensor.
    static func diff(device i: Int, weights: [TensorRecord]) -> [TensorRecord] {
        weights.enumerated().map { k, tensor in
            TensorRecord(name: tensor.name, shape: tensor.shape, values: tensor.values.indices.map { j in Float(sin(Double(i * 97 + k * 13 + j) * 0.3)) * 0.5 })
        }
    }

    @Test("three jobs train, take part in secure aggregation and report; the coordinator's mean is their weighted mean")
    func wholeCycles() async throws {
        let shapes = try JobCycleStateMachineTests.shapes()
        let length = shapes.values.reduce(0) { $0 + $1.reduce(1, *) }
        let plan = Self.securePlan()
        let coordinator = try FakeSecureCoordinator(
            configuration: plan.secureAggregation!.parameters, goal: 3, maximumSampleCount: 100, modelLength: length
        )
        let counts = [12, 30, 57]
        let (outcomes, transport, events, _) = try await Self.runJobs(count: 3, plan: plan, coordinator: coordinator) { i, context in
            LocalUpdate(diff: Self.diff(device: i, weights: context.model.weights), sampleCount: counts[i], metrics: ["loss": 1])
        }
        let receipt = ReportReceipt(cycle: SecureFixture.cycle, reportsReceived: nil, retryAfter: nil, fromEarlierWindow: false)
        for outcome in outcomes { #expect(try outcome.get() == .reported(receipt)) }
        #expect(transport.reports.withLock { $0 } == 0)
        #expect(events.contains(.phase(.secureAggregation)))
        #expect(!events.contains(.phase(.reporting)))

        let weights = try Safetensors.decode(Fixture.initialWeights()).tensors
        let updates = (0..<3).map { SecureAggregationExchange.flatten(Self.diff(device: $0, weights: weights)) }
        let result = try #require(transport.coordinator.withLock { $0.server.result })
        #expect(result.survivors == [1, 2, 3] && result.totalSampleCount == counts.reduce(0, +))
        let expected = SecureFixture.weightedMean(updates, counts: counts)
        let step = plan.secureAggregation!.parameters.quantizationStep
        var worst = 0.0
        for k in 0..<length { worst = max(worst, abs(Double(result.mean[k]) - expected[k])) }
        #expect(worst <= step + 1e-6)
    }

    @Test("local privacy first, then secure aggregation: the masked update is the clipped, noised one with sample count 1")
    func localPrivacyThenSecureAggregation() async throws {
        let shapes = try JobCycleStateMachineTests.shapes()
        let length = shapes.values.reduce(0) { $0 + $1.reduce(1, *) }
        let plan = Self.securePlan(localPrivacy: LocalPrivacy(clippingNorm: 1, noiseMultiplier: 0.1))
        let coordinator = try FakeSecureCoordinator(
            configuration: plan.secureAggregation!.parameters, goal: 3, maximumSampleCount: 100, modelLength: length
        )
        let (outcomes, transport, _, _) = try await Self.runJobs(count: 3, plan: plan, coordinator: coordinator) { i, context in
            LocalUpdate(diff: Self.diff(device: i, weights: context.model.weights), sampleCount: 40)
        }
        for outcome in outcomes {
            guard case .reported = try outcome.get() else {
                Issue.record("expected a report, got \(outcome)")
                continue
            }
        }
        // Local privacy made every sample count 1 (its updates are weighed alike) before the update was masked.
        let result = try #require(transport.coordinator.withLock { $0.server.result })
        #expect(result.totalSampleCount == 3)
    }

    @Test("a device that waits longer than the limit gives up with secure_aggregation_timeout")
    func timeout() async throws {
        let shapes = try JobCycleStateMachineTests.shapes()
        let length = shapes.values.reduce(0) { $0 + $1.reduce(1, *) }
        let plan = Self.securePlan()
        // A goal of 3 that only one device reaches: advertise_keys never closes.
        var coordinator = try FakeSecureCoordinator(
            configuration: plan.secureAggregation!.parameters, goal: 3, maximumSampleCount: 100, modelLength: length
        )
        coordinator.retryAfter = 4
        let (outcomes, _, _, _) = try await Self.runJobs(
            count: 1, plan: plan, coordinator: coordinator,
            configure: { configuration in
                configuration.secureAggregationWait = SecureAggregationWaitLimit(margin: 0, maximum: 10)
            }
        ) { i, context in
            LocalUpdate(diff: Self.diff(device: i, weights: context.model.weights), sampleCount: 5)
        }
        #expect(try outcomes[0].get() == .rejected(retryAfter: 4, reason: "secure_aggregation_timeout"))
    }

    @Test("cancellation while waiting for the other devices ends the cycle as cancelled, with nothing kept on disk")
    func cancelledWhileWaiting() async throws {
        let shapes = try JobCycleStateMachineTests.shapes()
        let length = shapes.values.reduce(0) { $0 + $1.reduce(1, *) }
        let plan = Self.securePlan()
        let coordinator = try FakeSecureCoordinator(
            configuration: plan.secureAggregation!.parameters, goal: 3, maximumSampleCount: 100, modelLength: length
        )
        // The background window expires during the first wait.
        let (outcomes, transport, _, _) = try await Self.runJobs(
            count: 1, plan: plan, coordinator: coordinator,
            configure: { configuration in
                configuration.environment = .seeded(1, clock: RecordingClock { _ in throw CancellationError() }, seedNoise: true)
            }
        ) { i, context in
            LocalUpdate(diff: Self.diff(device: i, weights: context.model.weights), sampleCount: 5)
        }
        guard case .failure(let error) = outcomes[0] else {
            Issue.record("expected cancellation, got \(outcomes[0])")
            return
        }
        #expect(error.code == .cancelled)
        #expect(transport.coordinator.withLock { $0.log.count } == 1)
    }

    @Test("a transport that cannot forward secure aggregation fails the cycle, naming itself")
    func forwardingOnly() async throws {
        let shapes = try JobCycleStateMachineTests.shapes()
        let length = shapes.values.reduce(0) { $0 + $1.reduce(1, *) }
        let plan = Self.securePlan()
        let inner = try SecureProcessTransport(
            plan: plan,
            coordinator: FakeSecureCoordinator(configuration: plan.secureAggregation!.parameters, goal: 3, maximumSampleCount: 100, modelLength: length)
        )
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-secure-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let configuration = DeviceConfiguration(storageDirectory: directory, environment: .seeded(1, clock: RecordingClock()), durability: .unsynced)
        let client = CoordinatorConnection(transport: ForwardingOnlyTransport(inner: inner), server: "memory", authToken: "w0", configuration: configuration)
        let job = try client.newJob(processName: "regressor", version: "1.0")
        do {
            _ = try await job.run { context in LocalUpdate(diff: Self.diff(device: 0, weights: context.model.weights), sampleCount: 5) }
            Issue.record("the cycle should fail")
        } catch {
            #expect(error.code == .invalidConfiguration)
            #expect(error.message.contains("ForwardingOnlyTransport"))
        }
    }
}
