import Crypto
import Foundation
import OrchardClient
import OrchardFormats
import OrchardML
import OrchardProtocol
import OrchardScheduler
import Synchronization
import OrchardTesting
import Testing

/// A scripted coordinator reached as a transport, for flow tests without a server: one open cycle, a fixed checkpoint, reports
/// idempotent by request key, optional credential check.
actor ScriptedCoordinator: ClientTransport {
    let capacity: Int
    let requiredToken: String?
    let retryAfter: Double
    let clientConfig: ClientConfig
    private(set) var reports: [String: [UInt8]] = [:]
    private var workers: [String: String] = [:]
    private var assignments: [String: String] = [:]
    private let weights: [UInt8]

    init(capacity: Int = 10, requiredToken: String? = nil, retryAfter: Double = 42, clientConfig: ClientConfig) throws {
        self.capacity = capacity
        self.requiredToken = requiredToken
        self.retryAfter = retryAfter
        self.clientConfig = clientConfig
        weights = try Fixture.initialWeights()
    }

    private func worker(_ session: String) throws(OrchardClientError) -> String {
        guard let worker = workers[session] else {
            throw .server(status: 401, body: ErrorBody(code: .unauthorized, message: "unknown session"))
        }
        return worker
    }

    private func assignment(_ key: String) -> CycleAssignment {
        CycleAssignment(requestKey: key, processID: "p", cycle: 1, checkpoint: 0, modelID: "p.0", planID: "p", reportWithin: 600)
    }

    func authenticate(_ request: AuthenticateRequest) throws(OrchardClientError) -> AuthenticateResponse {
        if let requiredToken, request.authToken != requiredToken {
            throw .server(status: 401, body: ErrorBody(code: .unauthorized, message: "invalid credential"))
        }
        let worker = "w\(workers.count + 1)"
        workers["t-\(worker)"] = worker
        return AuthenticateResponse(workerID: worker, sessionToken: "t-\(worker)", expiresIn: 3600, requiresSpeedTest: false)
    }

    func requestCycle(_ request: CycleRequest, session: String) throws(OrchardClientError) -> CycleResponse {
        let worker = try worker(session)
        if let key = assignments[worker] {
            if reports[key] != nil { return .rejected(CycleRejection(retryAfter: retryAfter, reason: "already_reported")) }
            return .accepted(assignment(key))
        }
        guard assignments.count < capacity else { return .rejected(CycleRejection(retryAfter: retryAfter, reason: "cycle_full")) }
        let key = "k-\(worker)"
        assignments[worker] = key
        return .accepted(assignment(key))
    }

    func plan(_ planID: String, requestKey: String, session: String) throws(OrchardClientError) -> TrainingPlan {
        _ = try worker(session)
        return TrainingPlan(planID: planID, model: Fixture.spec, clientConfig: clientConfig)
    }

    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) throws(OrchardClientError) {
        _ = try worker(session)
        let etag = "\"p.0\""
        // The same selection as the coordinator's: resume only bytes of the same entity.
        let start = request.offset > 0 && request.etag == etag && request.offset < weights.count ? request.offset : 0
        try sink.begin(DownloadHead(start: start, totalLength: weights.count, etag: etag, sha256: Array(SHA256.hash(data: weights))))
        try sink.append(Array(weights[start...]))
    }

    func report(_ body: [UInt8], session: String) throws(OrchardClientError) -> ReportResponse {
        _ = try worker(session)
        guard let archive = try? Safetensors.decode(body), let metadata = try? ReportEnvelope.metadata(of: archive) else {
            throw .server(status: 400, body: ErrorBody(code: .malformedSafetensors, message: "not a report"))
        }
        if reports[metadata.requestKey] != nil {
            throw .server(status: 409, body: ErrorBody(code: .reportAlreadyReceived, message: "already received"))
        }
        reports[metadata.requestKey] = body
        return ReportResponse(cycle: 1, reportsReceived: reports.count, retryAfter: 60)
    }
}

@Suite("Cycle flow on the in-memory transport")
struct CycleFlowTests {
    static let config = ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 3)

    struct Device {
        let directory: URL
        let coordinator: ScriptedCoordinator

        func client(
            trainer: any LocalTrainer = EngineLocalTrainer(), retry: RequestRetryPolicy = RequestRetryPolicy(maximumAttempts: 3), token: String? = nil,
            conditions: (any DeviceConditionsProvider)? = nil
        ) -> (CoordinatorConnection, RecordingTransport) {
            let transport = RecordingTransport(coordinator)
            let configuration = DeviceConfiguration(
                storageDirectory: directory, retry: retry, environment: .seeded(1, clock: RecordingClock()), trainingSeed: 42,
                trainer: trainer, conditions: conditions
            )
            return (CoordinatorConnection(transport: transport, server: "scripted", authToken: token, configuration: configuration), transport)
        }
    }

    func withDevice(capacity: Int = 10, requiredToken: String? = nil, _ body: (Device) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-flow-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try await body(
            Device(directory: directory, coordinator: try ScriptedCoordinator(capacity: capacity, requiredToken: requiredToken, clientConfig: Self.config)))
    }

    @Test("a full cycle: phases in order, one event per batch, the engine's diff reported")
    func fullCycle() async throws {
        try await withDevice { device in
            let (client, transport) = device.client()
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let events = collectEvents(job)
            let outcome = try await job.train(on: Fixture.dataset())
            guard case .reported(let receipt) = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(receipt.retryAfter == 60)
            let seen = await events.value
            let phases = seen.compactMap { if case .phase(let p) = $0 { p } else { nil } }
            #expect(phases == [.authenticating, .requestingCycle, .downloadingPlan, .downloadingModel, .training, .reporting, .finished])
            #expect(seen.compactMap { if case .trained(let s) = $0 { s } else { nil } }.count == 36)
            let reported = try diffOf(try #require(transport.log.withLock { $0.reports.first }))
            #expect(reported == (try referenceDiff(clientConfig: Self.config, seed: 43)))
            #expect(await device.coordinator.reports.count == 1)
        }
    }

    @Test("a download cut short resumes from the bytes on disk")
    func downloadResumes() async throws {
        try await withDevice { device in
            let (client, transport) = device.client()
            transport.downloadFaults.withLock { $0 = [.cutDownload(after: 120)] }
            let outcome = try await client.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset())
            guard case .reported = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            let (requests, heads) = transport.log.withLock { ($0.modelRequests, $0.downloadHeads) }
            #expect(requests.map(\.offset) == [0, 120])
            #expect(requests.last?.etag == "\"p.0\"")
            #expect(heads.map(\.start) == [0, 120])
            let reported = try diffOf(try #require(transport.log.withLock { $0.reports.first }))
            #expect(reported == (try referenceDiff(clientConfig: Self.config, seed: 43)))
        }
    }

    @Test("cancelled mid-training, resumed in a new client: the diff is bit-identical to an uninterrupted run", arguments: [1, 7, 12, 35])
    func cancelAndResume(after updates: Int) async throws {
        try await withDevice { device in
            let (first, _) = device.client(trainer: InterruptingTrainer(cancelAfterUpdates: updates))
            let firstJob = try first.newJob(processName: "regressor", version: "1.0")
            let dataset = try Fixture.dataset()
            let window = Task { try await firstJob.train(on: dataset) }
            let error = await #expect(throws: OrchardClientError.self) { try await window.value }
            #expect(error?.code == .cancelled)
            #expect(FileManager.default.fileExists(atPath: firstJob.directory.appendingPathComponent("training-checkpoint.bin").path))

            let (second, transport) = device.client()
            let job = try second.newJob(processName: "regressor", version: "1.0")
            let events = collectEvents(job)
            _ = try await job.train(on: dataset)
            let seen = await events.value
            #expect(seen.contains(.resumedTraining))
            #expect(seen.compactMap { if case .trained(let s) = $0 { s } else { nil } }.count == 36 - updates)
            #expect(transport.log.withLock { $0.modelRequests.isEmpty })
            let reported = try diffOf(try #require(transport.log.withLock { $0.reports.first }))
            #expect(reported == (try referenceDiff(clientConfig: Self.config, seed: 43)))
        }
    }

    @Test("a report whose answer was lost is uploaded once more, recognised as delivered, and counted once")
    func lostAnswer() async throws {
        try await withDevice { device in
            let (first, firstTransport) = device.client(retry: .none)
            firstTransport.reportFaults.withLock { $0 = [.dropAnswer] }
            let error = await #expect(throws: OrchardClientError.self) {
                try await first.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset())
            }
            #expect(error?.code == .network)
            let (second, secondTransport) = device.client()
            let outcome = try await second.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset())
            #expect(outcome == .rejected(retryAfter: 42, reason: "already_reported"))
            #expect(secondTransport.log.withLock { $0.reportAttempts } == 1)
            #expect(await device.coordinator.reports.count == 1)
        }
    }

    @Test("callbacks: a rejection calls onRejected once with the server's retry-after; a bad credential calls onError once")
    func callbacks() async throws {
        try await withDevice(capacity: 0, requiredToken: "good") { device in
            let counter = Counter()
            let seconds = Mutex<Double?>(nil)
            let (client, _) = device.client(token: "good", conditions: ScriptedConditionsProvider(.ideal))
            let job = try client.newJob(processName: "regressor", version: "1.0")
            job.onReady { _, _, _, _ in counter.hit("ready") }
            job.onReported { _ in counter.hit("reported") }
            job.onError { _ in counter.hit("error") }
            job.onRejected { value in
                counter.hit("rejected")
                seconds.withLock { $0 = value }
            }
            await job.start().value
            #expect(counter["rejected"] == 1)
            #expect(seconds.withLock { $0 } == 42)
            #expect(counter["ready"] + counter["reported"] + counter["error"] == 0)

            let errors = Counter()
            let (badClient, _) = device.client(token: "bad", conditions: ScriptedConditionsProvider(.ideal))
            let badJob = try badClient.newJob(processName: "other", version: "1.0")
            badJob.onError { error in errors.hit(error.code == .authenticationFailed ? "auth" : "other") }
            badJob.onRejected { _ in errors.hit("rejected") }
            await badJob.start().value
            #expect(errors["auth"] == 1)
            #expect(errors["other"] + errors["rejected"] == 0)
        }
    }
}
