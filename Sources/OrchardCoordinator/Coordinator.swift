public import OrchardSupport
import CoreMetrics
import Foundation
public import Logging
import OrchardFormats
public import OrchardProtocol
import Synchronization

/// The coordinator's core: every device and admin operation as an async method, independent of HTTP.
///
/// The HTTP routes (``CoordinatorServer``) are thin wrappers around these methods, and an in-process transport
/// (client SDK tests, the simulator) can call them directly. Cycle logic lives in ``CycleStateMachine``; this
/// actor owns one per process, performs the I/O its decisions call for, and keeps the running sums.
public actor Coordinator {
    /// A process's live state, owned by the actor. A class so that folding a report or admitting a device
    /// mutates it in place: as a value in `runtimes`, every mutation would copy the running sum and the
    /// assignment table.
    private final class Runtime {
        var process: StoredProcess
        var machine: CycleStateMachine
        var layout: ModelLayout
        var sum: RunningSum
        var unfolded: [String]
        var checkpointBytes: [UInt8]
        var optimizer: ServerOptimizerState
        var authenticator: DeviceAuthenticator
        var currentKeys: Set<String>
        var previousKeys: Set<String>
        /// Whether a write of the running sum is in flight (one at a time, so they commit in order).
        var folding = false

        init(
            process: StoredProcess, machine: CycleStateMachine, layout: ModelLayout, sum: RunningSum, unfolded: [String],
            checkpointBytes: [UInt8], optimizer: ServerOptimizerState, authenticator: DeviceAuthenticator, currentKeys: Set<String>,
            previousKeys: Set<String>
        ) {
            self.process = process
            self.machine = machine
            self.layout = layout
            self.sum = sum
            self.unfolded = unfolded
            self.checkpointBytes = checkpointBytes
            self.optimizer = optimizer
            self.authenticator = authenticator
            self.currentKeys = currentKeys
            self.previousKeys = previousKeys
        }
    }

    private struct NameVersion: Hashable {
        var name: String
        var version: SemanticVersion
    }

    /// What a report needs between its checks in the actor and its commit.
    private struct ReportTicket: Sendable {
        var processID: String
        var cycle: Int
        var layout: ModelLayout
        var maximumSampleCount: Int
    }

    /// A model download.
    public struct ModelDownload: Sendable {
        /// The safetensors bytes.
        public var bytes: [UInt8]
        /// A strong entity tag naming the checkpoint.
        public var etag: String
    }

    /// The store.
    public nonisolated let store: any CoordinatorStore
    /// The instance settings.
    public nonisolated let configuration: CoordinatorConfiguration
    private let clock: any WallClock
    private var random: ErasedRandom
    private let metrics: CoordinatorMetrics
    private let logger: Logger
    private var runtimes: [String: Runtime] = [:]
    private var processByName: [NameVersion: String] = [:]
    private var processForKey: [String: String] = [:]
    private var knownWorkers: Set<String> = []
    /// Session tokens are checked outside the actor (every device request carries one).
    private nonisolated let sessionIssuer = Mutex<SessionIssuer?>(nil)

    /// Creates a coordinator; call ``start()`` before use.
    /// - Parameters:
    ///   - store: Durable storage.
    ///   - configuration: Instance settings.
    ///   - clock: Wall-clock time (injected so tests and simulations control deadlines).
    ///   - random: Randomness for ids, request keys and pace-steering jitter.
    ///   - metrics: Where metrics go.
    ///   - logger: Structured logs.
    public init(
        store: any CoordinatorStore, configuration: CoordinatorConfiguration = CoordinatorConfiguration(),
        clock: any WallClock = SystemClock(), random: any RandomNumberGenerator & Sendable = SystemRandomNumberGenerator(),
        metrics: CoordinatorMetrics = .discarding, logger: Logger = Logger(label: "orchard.coordinator")
    ) {
        self.store = store
        self.configuration = configuration
        self.clock = clock
        self.random = ErasedRandom(base: random)
        self.metrics = metrics
        self.logger = logger
    }

    // MARK: Start-up and recovery

    /// Loads every process and resumes its open cycle: assignments, the stored running sum, and the diffs
    /// committed since it was last written.
    public func start() async throws {
        var candidate: [UInt8] = []
        for _ in 0..<32 { candidate.append(UInt8.random(in: .min ... .max, using: &random)) }
        let fresh = candidate
        let secret = try await store.secret(named: "session", make: { fresh })
        let issuer = await SessionIssuer(secret: secret)
        sessionIssuer.withLock { $0 = issuer }
        runtimes = [:]
        processByName = [:]
        processForKey = [:]
        for process in try await store.processes() {
            try await load(process)
        }
        logger.info("coordinator started", metadata: ["processes": "\(runtimes.count)"])
    }

    private func load(_ process: StoredProcess) async throws {
        guard let weights = try await store.checkpoint(processID: process.id, number: process.latestCheckpoint) else {
            throw StoreError(.corrupt, "process \(process.id) has no checkpoint \(process.latestCheckpoint)")
        }
        let archive = try Safetensors.decode(weights)
        let layout = try ModelLayout(weights: archive.tensors, model: process.model)
        let optimizer = try await store.optimizerState(processID: process.id).map { try ServerOptimizerState(bytes: $0) } ?? ServerOptimizerState()
        let config = CycleStateMachine.Configuration(process.serverConfig)
        var machine: CycleStateMachine
        var sum = RunningSum(count: layout.totalCount)
        var unfolded: [String] = []
        var keys: Set<String> = []
        if !process.completed, let open = try await store.openCycle(processID: process.id) {
            let assignments = open.assignments.map {
                CycleStateMachine.Assignment(workerID: $0.workerID, requestKey: $0.requestKey, state: $0.reported ? .reported : .assigned)
            }
            machine = CycleStateMachine(
                configuration: config, cycle: open.cycle.number, checkpoint: open.cycle.checkpoint, openedAt: open.cycle.openedAt,
                completedCycles: process.cyclesCompleted, abandonedCycles: process.cyclesAbandoned, assignments: assignments
            )
            if let stored = open.sum {
                sum = try RunningSum(bytes: stored.bytes, weight: stored.weight, reports: stored.reports, count: layout.totalCount)
            }
            let accumulator = RecoveryAccumulator(sum: sum)
            let count = layout.totalCount
            try await store.forEachPendingDiff(processID: process.id, cycle: open.cycle.number) { pending in
                guard pending.diff.count == count * 4 else {
                    throw StoreError(.corrupt, "stored diff of worker \(pending.workerID) has \(pending.diff.count) bytes")
                }
                accumulator.add(pending.diff, weight: Double(pending.sampleCount), worker: pending.workerID)
            }
            (sum, unfolded) = accumulator.result
            keys = Set(open.assignments.map(\.requestKey))
            for key in keys { processForKey[key] = process.id }
        } else {
            machine = CycleStateMachine(
                configuration: config, cycle: process.cyclesCompleted + process.cyclesAbandoned, checkpoint: process.latestCheckpoint,
                openedAt: process.createdAt, completedCycles: process.cyclesCompleted, abandonedCycles: process.cyclesAbandoned, completed: true
            )
        }
        let authenticator = try await DeviceAuthenticator(process.serverConfig.authentication)
        runtimes[process.id] = Runtime(
            process: process, machine: machine, layout: layout, sum: sum, unfolded: unfolded, checkpointBytes: weights,
            optimizer: optimizer, authenticator: authenticator, currentKeys: keys, previousKeys: []
        )
        processByName[NameVersion(name: process.name, version: process.version)] = process.id
        if !unfolded.isEmpty {
            logger.info("resumed cycle with unfolded reports", metadata: ["process": "\(process.id)", "cycle": "\(machine.cycle)", "reports": "\(unfolded.count)"])
        }
    }

    private func randomHex(_ bytes: Int) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes * 2)
        var word: UInt64 = 0
        for index in 0..<bytes {
            if index % 8 == 0 { word = random.next() }
            let byte = UInt8(truncatingIfNeeded: word >> (8 * UInt64(index % 8)))
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    private func storeFailure(_ error: any Error, _ what: String) -> CoordinatorError {
        logger.error("store failure", metadata: ["operation": "\(what)", "error": "\(error)"])
        return .internalError("the coordinator could not \(what); try again")
    }

    // MARK: Device API

    /// Authenticates a device for a process and issues its session token.
    public func authenticate(_ request: AuthenticateRequest) async throws(CoordinatorError) -> AuthenticateResponse {
        guard WireProtocol.isCompatible(request.protocolVersion) else {
            throw CoordinatorError(.unsupportedVersion, "protocol version \(request.protocolVersion) is not compatible with \(WireProtocol.version)")
        }
        guard let processID = processByName[NameVersion(name: request.processName, version: request.processVersion)],
              let runtime = runtimes[processID]
        else {
            throw CoordinatorError(.unknownProcess, "no process '\(request.processName)' version \(request.processVersion)")
        }
        let now = clock.date
        let subject = try await runtime.authenticator.subject(of: request.authToken, now: now)
        let workerID: String
        do {
            if let subject, let existing = try await store.workerID(forSubject: subject) {
                workerID = existing
            } else {
                let id = "w_" + randomHex(12)
                try await store.registerWorker(id: id, subject: subject, at: now)
                workerID = id
            }
        } catch {
            throw storeFailure(error, "register the worker")
        }
        knownWorkers.insert(workerID)
        guard let sessions = sessionIssuer.withLock({ $0 }) else { throw .internalError("coordinator not started") }
        let token = try await sessions.issue(workerID: workerID, expires: now.addingTimeInterval(configuration.sessionLifetime))
        return AuthenticateResponse(
            workerID: workerID, sessionToken: token, expiresIn: configuration.sessionLifetime,
            requiresSpeedTest: runtime.process.serverConfig.requiresSpeedTest
        )
    }

    /// The worker id a session token belongs to.
    public nonisolated func worker(forSessionToken token: String) async throws(CoordinatorError) -> String {
        guard let sessions = sessionIssuer.withLock({ $0 }) else { throw .internalError("coordinator not started") }
        return try await sessions.workerID(from: token, now: clock.date)
    }

    private func requireKnownWorker(_ workerID: String) async throws(CoordinatorError) {
        if knownWorkers.contains(workerID) { return }
        let exists: Bool
        do {
            exists = try await store.workerExists(id: workerID)
        } catch {
            throw storeFailure(error, "look up the worker")
        }
        guard exists else { throw CoordinatorError(.unknownWorker, "worker '\(workerID)' is not registered") }
        knownWorkers.insert(workerID)
    }

    /// A device asks to join the current cycle.
    /// - Parameters:
    ///   - request: The request.
    ///   - sessionWorker: The worker id proven by the session token.
    public func requestCycle(_ request: CycleRequest, sessionWorker: String) async throws(CoordinatorError) -> CycleResponse {
        guard request.workerID == sessionWorker else {
            throw CoordinatorError(.forbidden, "the session token belongs to another worker")
        }
        try await requireKnownWorker(request.workerID)
        guard let processID = processByName[NameVersion(name: request.processName, version: request.processVersion)],
              let runtime = runtimes[processID]
        else {
            throw CoordinatorError(.unknownProcess, "no process '\(request.processName)' version \(request.processVersion)")
        }
        let server = runtime.process.serverConfig
        let now = clock.date
        let jitter = Double.random(in: 0...1, using: &random)
        if let minimum = server.minimumDownloadMbps {
            guard let measured = request.downloadMbps else {
                throw CoordinatorError(.invalidRequest, "this process requires download_mbps from a speed test")
            }
            if measured < minimum {
                metrics.checkinsRejected.increment()
                return .rejected(CycleRejection(retryAfter: (server.paceSteeringWindow * (1 + jitter)).rounded(.up), reason: "download_too_slow"))
            }
        }
        if let minimum = server.minimumUploadMbps {
            guard let measured = request.uploadMbps else {
                throw CoordinatorError(.invalidRequest, "this process requires upload_mbps from a speed test")
            }
            if measured < minimum {
                metrics.checkinsRejected.increment()
                return .rejected(CycleRejection(retryAfter: (server.paceSteeringWindow * (1 + jitter)).rounded(.up), reason: "upload_too_slow"))
            }
        }
        let key = randomHex(16)
        let decision = runtime.machine.requestCycle(workerID: request.workerID, now: now, newRequestKey: key, jitter: jitter)
        switch decision {
        case .rejected(let retryAfter, let reason):
            metrics.checkinsRejected.increment()
            return .rejected(CycleRejection(retryAfter: retryAfter, reason: reason))
        case .assigned(let assignment, let reportWithin, let isNew):
            let cycle = runtime.machine.cycle
            let checkpoint = runtime.machine.checkpoint
            if isNew {
                runtime.currentKeys.insert(assignment.requestKey)
                processForKey[assignment.requestKey] = processID
                do {
                    try await store.recordAssignment(processID: processID, cycle: cycle, workerID: request.workerID, requestKey: assignment.requestKey, at: now)
                } catch {
                    if let current = runtimes[processID], current.machine.cycle == cycle {
                        current.machine.revokeAssignment(workerID: request.workerID)
                        current.currentKeys.remove(assignment.requestKey)
                    }
                    processForKey[assignment.requestKey] = nil
                    throw storeFailure(error, "record the assignment")
                }
                metrics.openCycleAssigned.record(runtimes[processID]?.machine.assignments.count ?? 0)
            }
            metrics.checkinsAccepted.increment()
            return .accepted(CycleAssignment(
                requestKey: assignment.requestKey, processID: processID, cycle: cycle, checkpoint: checkpoint,
                modelID: "\(processID).\(checkpoint)", planID: processID,
                reportWithin: reportWithin
            ))
        }
    }

    private func assignedRuntime(requestKey: String, workerID: String) throws(CoordinatorError) -> Runtime {
        guard let processID = processForKey[requestKey], let runtime = runtimes[processID],
              runtime.machine.assignments[workerID]?.requestKey == requestKey
        else {
            throw CoordinatorError(.invalidRequestKey, "request key is not one issued to this worker for an open cycle")
        }
        return runtime
    }

    /// The model a device was assigned, for download.
    public func model(_ modelID: String, requestKey: String, sessionWorker: String) throws(CoordinatorError) -> ModelDownload {
        let runtime = try assignedRuntime(requestKey: requestKey, workerID: sessionWorker)
        let expected = "\(runtime.process.id).\(runtime.machine.checkpoint)"
        guard modelID == expected else {
            throw CoordinatorError(.unknownCheckpoint, "model '\(modelID)' is not the one assigned (\(expected))")
        }
        return ModelDownload(bytes: runtime.checkpointBytes, etag: "\"\(expected)\"")
    }

    /// The training plan a device was assigned.
    public func plan(_ planID: String, requestKey: String, sessionWorker: String) throws(CoordinatorError) -> TrainingPlan {
        let runtime = try assignedRuntime(requestKey: requestKey, workerID: sessionWorker)
        guard planID == runtime.process.id else {
            throw CoordinatorError(.notFound, "plan '\(planID)' is not the one assigned (\(runtime.process.id))")
        }
        return TrainingPlan(planID: planID, model: runtime.process.model, clientConfig: runtime.process.clientConfig)
    }

    /// Accepts a report (a ``ReportEnvelope``); returns only after its contribution is committed.
    /// - Parameters:
    ///   - body: The safetensors body.
    ///   - sessionWorker: The worker id proven by the session token.
    public nonisolated func report(_ body: [UInt8], sessionWorker: String) async throws(CoordinatorError) -> ReportResponse {
        let index: SafetensorsIndex
        do throws(FormatError) {
            index = try Safetensors.index(body)
        } catch {
            await refused()
            if error.code == .dtypeMismatch || error.code == .unsupportedDType {
                throw CoordinatorError(.dtypeMismatch, error.message)
            }
            throw CoordinatorError(.malformedSafetensors, error.message)
        }
        let metadata: ReportMetadata
        do throws(FormatError) {
            metadata = try ReportEnvelope.metadata(in: index.metadata)
        } catch {
            await refused()
            throw CoordinatorError(.invalidRequest, error.message)
        }
        guard metadata.workerID == sessionWorker else {
            await refused()
            throw CoordinatorError(.forbidden, "the session token belongs to another worker")
        }
        let ticket = try await beginReport(metadata)
        let flat: [UInt8]
        do throws(CoordinatorError) {
            guard (1...ticket.maximumSampleCount).contains(metadata.sampleCount) else {
                throw CoordinatorError(.invalidSampleCount, "sample_count \(metadata.sampleCount) is not in 1...\(ticket.maximumSampleCount)")
            }
            flat = try ticket.layout.flattenBytes(index, in: body)
            try ticket.layout.checkDiff(bytes: flat)
        } catch {
            await abortReport(ticket, workerID: metadata.workerID)
            throw error
        }
        let metricsJSON = (try? WireCoding.encoder().encode(metadata.metrics)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
        let record = ReportRecord(
            processID: ticket.processID, cycle: ticket.cycle, workerID: metadata.workerID, requestKey: metadata.requestKey,
            sampleCount: metadata.sampleCount, metricsJSON: metricsJSON, diff: flat
        )
        let started = ContinuousClock.now
        do {
            try await store.recordReport(record)
        } catch {
            await abortReport(ticket, workerID: metadata.workerID)
            if let storeError = error as? StoreError, storeError.code == .cycleClosed {
                throw CoordinatorError(.deadlinePassed, "cycle \(ticket.cycle) closed before the report was committed")
            }
            if let storeError = error as? StoreError, storeError.code == .duplicate {
                throw CoordinatorError(.reportAlreadyReceived, storeError.message)
            }
            throw await storeFailure(error, "commit the report")
        }
        metrics.reportCommitSeconds.recordNanoseconds((ContinuousClock.now - started).inNanoseconds)
        metrics.reportBytes.increment(by: body.count)
        return await commitReport(ticket, workerID: metadata.workerID, sampleCount: metadata.sampleCount, diff: flat)
    }

    private func refused() { metrics.reportsRefused.increment() }

    private func beginReport(_ metadata: ReportMetadata) async throws(CoordinatorError) -> ReportTicket {
        try await requireKnownWorker(metadata.workerID)
        guard let processID = processForKey[metadata.requestKey], let runtime = runtimes[processID] else {
            metrics.reportsRefused.increment()
            throw CoordinatorError(.invalidRequestKey, "request key is not one issued for an open cycle")
        }
        switch runtime.machine.beginReport(workerID: metadata.workerID, requestKey: metadata.requestKey, now: clock.date) {
        case .refused(let code, let message):
            metrics.reportsRefused.increment()
            switch code {
            case .invalidRequestKey: throw CoordinatorError(code, message)
            default: throw CoordinatorError(code, message)
            }
        case .proceed(let cycle):
            return ReportTicket(processID: processID, cycle: cycle, layout: runtime.layout, maximumSampleCount: runtime.process.serverConfig.maximumSampleCount)
        }
    }

    private func abortReport(_ ticket: ReportTicket, workerID: String) async {
        metrics.reportsRefused.increment()
        guard let runtime = runtimes[ticket.processID], runtime.machine.cycle == ticket.cycle else { return }
        let action = runtime.machine.abortReport(workerID: workerID)
        if let action { await perform(action, processID: ticket.processID) }
    }

    private func commitReport(_ ticket: ReportTicket, workerID: String, sampleCount: Int, diff: [UInt8]) async -> ReportResponse {
        metrics.reportsAccepted.increment()
        guard let runtime = runtimes[ticket.processID], runtime.machine.cycle == ticket.cycle else {
            // The process was deleted while the report was committed; it was still acknowledged by the store.
            return ReportResponse(cycle: ticket.cycle, reportsReceived: 0, retryAfter: 0)
        }
        runtime.sum.add(bytes: diff, weight: Double(sampleCount))
        runtime.unfolded.append(workerID)
        let action = runtime.machine.commitReport(workerID: workerID)
        let received = runtime.machine.reported
        let retryAfter = max(0, runtime.machine.deadline.timeIntervalSince(clock.date)).rounded(.up)
        metrics.openCycleReported.record(received)
        let fold: (sum: [UInt8], weight: Double, reports: Int, workers: [String])?
        if action == nil && !runtime.folding && runtime.unfolded.count >= configuration.foldInterval {
            runtime.folding = true
            fold = (runtime.sum.bytes, runtime.sum.weight, runtime.sum.reports, runtime.unfolded)
        } else {
            fold = nil
        }
        var closed = false
        if let action {
            await perform(action, processID: ticket.processID)
            // Closed when the transition went through: the process moved past the report's cycle (or finished).
            closed = runtimes[ticket.processID].map { $0.machine.cycle != ticket.cycle } ?? true
        } else if let fold {
            do {
                try await store.foldReports(processID: ticket.processID, cycle: ticket.cycle, sum: fold.sum, weight: fold.weight, reports: fold.reports, workers: fold.workers)
                if let current = runtimes[ticket.processID], current.machine.cycle == ticket.cycle {
                    let folded = Set(fold.workers)
                    current.unfolded.removeAll { folded.contains($0) }
                }
                runtime.folding = false
            } catch {
                runtime.folding = false
                // The diffs stay in the store and are folded again on recovery; nothing is lost.
                logger.warning("could not write the running sum", metadata: ["process": "\(ticket.processID)", "error": "\(error)"])
            }
        }
        return ReportResponse(cycle: ticket.cycle, reportsReceived: received, retryAfter: retryAfter, cycleClosed: closed)
    }

    // MARK: Timer and transitions

    /// Advances every process's cycle to the current time: closes cycles whose deadline passed.
    public func tick() async {
        let now = clock.date
        for processID in runtimes.keys.sorted() {
            guard let runtime = runtimes[processID] else { continue }
            let action = runtime.machine.timerFired(now: now)
            if let action { await perform(action, processID: processID) }
        }
    }

    private func perform(_ action: CycleStateMachine.CycleAction, processID: String) async {
        guard let runtime = runtimes[processID] else { return }
        let now = clock.date
        let transition = runtime.machine.plan(action, now: now)
        let started = ContinuousClock.now
        var closure = CycleClosure(
            processID: processID, closedCycle: transition.closedCycle, checkpoint: nil, optimizerState: nil,
            nextCycle: transition.nextCycle.map { StoredCycle(number: $0, checkpoint: transition.checkpoint, openedAt: transition.openedAt) },
            retention: runtime.process.serverConfig.checkpointRetention
        )
        var newWeights: [UInt8]?
        var newOptimizer = runtime.optimizer
        if transition.aggregated {
            do {
                var weights = try runtime.layout.flatten(try Safetensors.decode(runtime.checkpointBytes).tensors)
                ServerOptimizer.step(weights: &weights, delta: runtime.sum.mean(), state: &newOptimizer, config: runtime.process.serverConfig.aggregator, layout: runtime.layout)
                let bytes = Safetensors.encode(runtime.layout.records(weights), metadata: [
                    "orchard.process": processID, "orchard.checkpoint": "\(transition.checkpoint)",
                ])
                newWeights = bytes
                closure.checkpoint = (transition.checkpoint, bytes)
                closure.optimizerState = newOptimizer.bytes
            } catch {
                logger.error("aggregation failed", metadata: ["process": "\(processID)", "error": "\(error)"])
                runtime.machine.transitionFailed()
                return
            }
        }
        do {
            try await store.closeCycle(closure)
        } catch {
            logger.error("cycle transition not persisted; retrying on the next tick", metadata: ["process": "\(processID)", "error": "\(error)"])
            if let current = runtimes[processID] {
                current.machine.transitionFailed()
            }
            return
        }
        guard let current = runtimes[processID] else { return }
        current.machine.apply(transition)
        current.sum = RunningSum(count: current.layout.totalCount)
        current.unfolded = []
        for key in current.previousKeys { processForKey[key] = nil }
        current.previousKeys = current.currentKeys
        current.currentKeys = []
        if let newWeights {
            current.checkpointBytes = newWeights
            current.optimizer = newOptimizer
            current.process.latestCheckpoint = transition.checkpoint
            current.process.cyclesCompleted += 1
            metrics.cyclesAggregated.increment()
        } else {
            current.process.cyclesAbandoned += 1
            metrics.cyclesAbandoned.increment()
        }
        current.process.completed = transition.nextCycle == nil
        metrics.aggregationSeconds.recordNanoseconds((ContinuousClock.now - started).inNanoseconds)
        metrics.openCycleAssigned.record(0)
        metrics.openCycleReported.record(0)
        switch action {
        case .aggregate(let cycle, let reports):
            logger.info("cycle aggregated", metadata: ["process": "\(processID)", "cycle": "\(cycle)", "reports": "\(reports)", "checkpoint": "\(transition.checkpoint)"])
        case .abandon(let cycle, let reports):
            logger.notice("cycle abandoned", metadata: ["process": "\(processID)", "cycle": "\(cycle)", "reports": "\(reports)"])
        }
    }

    // MARK: Admin API

    /// Hosts a new FL process: validates the model, weights and configurations, stores checkpoint 0, opens cycle 1.
    public func host(_ request: HostProcessRequest) async throws(CoordinatorError) -> ProcessStatus {
        guard !request.name.isEmpty, request.name.count <= 200 else {
            throw CoordinatorError(.invalidConfiguration, "name must be 1 to 200 characters")
        }
        do throws(FormatError) {
            try request.model.validate()
        } catch {
            throw CoordinatorError(.invalidConfiguration, error.message)
        }
        if let failure = request.clientConfig.validationFailure() ?? request.serverConfig.validationFailure() {
            throw CoordinatorError(.invalidConfiguration, failure)
        }
        let archive: SafetensorsArchive
        do throws(FormatError) {
            archive = try Safetensors.decode(request.initialWeights)
        } catch {
            throw CoordinatorError(.malformedSafetensors, "initial_weights: \(error.message)")
        }
        let layout = try ModelLayout(weights: archive.tensors, model: request.model)
        let flat = try layout.flatten(archive.tensors)
        if flat.contains(where: { !$0.isFinite }) {
            throw CoordinatorError(.invalidConfiguration, "initial_weights hold NaN or infinity")
        }
        _ = try await DeviceAuthenticator(request.serverConfig.authentication)
        let now = clock.date
        let process = StoredProcess(
            id: "p_" + randomHex(8), name: request.name, version: request.version, model: request.model,
            clientConfig: request.clientConfig, serverConfig: request.serverConfig, createdAt: now
        )
        let weights = Safetensors.encode(layout.records(flat), metadata: ["orchard.process": process.id, "orchard.checkpoint": "0"])
        do {
            try await store.createProcess(process, initialWeights: weights, firstCycle: StoredCycle(number: 1, checkpoint: 0, openedAt: now))
        } catch let error as StoreError where error.code == .duplicate {
            throw CoordinatorError(.processExists, error.message)
        } catch {
            throw storeFailure(error, "store the process")
        }
        do {
            try await load(process)
        } catch {
            throw storeFailure(error, "load the new process")
        }
        logger.info("process hosted", metadata: ["process": "\(process.id)", "name": "\(process.name)", "version": "\(process.version)"])
        return try await status(processID: process.id)
    }

    /// Every hosted process.
    public func processList() async throws(CoordinatorError) -> ProcessList {
        var statuses: [ProcessStatus] = []
        for id in runtimes.keys.sorted() {
            statuses.append(try await status(processID: id))
        }
        return ProcessList(processes: statuses)
    }

    /// The status of one process and its open cycle.
    public func status(processID: String) async throws(CoordinatorError) -> ProcessStatus {
        guard let runtime = runtimes[processID] else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        let numbers: [Int]
        do {
            numbers = try await store.checkpointNumbers(processID: processID)
        } catch {
            throw storeFailure(error, "list checkpoints")
        }
        guard let current = runtimes[processID] else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        let machine = current.machine
        let cycle: CycleStatus? = machine.phase == .completed ? nil : CycleStatus(
            number: machine.cycle, checkpoint: machine.checkpoint, openedAt: machine.openedAt.timeIntervalSince1970,
            deadline: machine.deadline.timeIntervalSince1970, assigned: machine.assignments.count, reported: machine.reported,
            goal: machine.configuration.goalCount, capacity: machine.configuration.capacity
        )
        var server = runtime.process.serverConfig
        server.authentication.secret = server.authentication.secret == nil ? nil : "<redacted>"
        return ProcessStatus(
            processID: processID, name: current.process.name, version: current.process.version,
            state: machine.phase == .completed ? "completed" : "running", latestCheckpoint: current.process.latestCheckpoint,
            checkpoints: numbers, cyclesCompleted: machine.completedCycles, cyclesAbandoned: machine.abandonedCycles,
            currentCycle: cycle, clientConfig: current.process.clientConfig, serverConfig: server
        )
    }

    /// A stored checkpoint's safetensors bytes; `number` nil means the latest.
    public func checkpoint(processID: String, number: Int?) async throws(CoordinatorError) -> (number: Int, bytes: [UInt8]) {
        guard let runtime = runtimes[processID] else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        let wanted = number ?? runtime.process.latestCheckpoint
        if wanted == runtime.process.latestCheckpoint { return (wanted, runtime.checkpointBytes) }
        let bytes: [UInt8]?
        do {
            bytes = try await store.checkpoint(processID: processID, number: wanted)
        } catch {
            throw storeFailure(error, "read the checkpoint")
        }
        guard let bytes else { throw CoordinatorError(.unknownCheckpoint, "process '\(processID)' has no checkpoint \(wanted) (pruned or not yet written)") }
        return (wanted, bytes)
    }

    /// Deletes a process and everything stored for it.
    public func delete(processID: String) async throws(CoordinatorError) {
        guard let runtime = runtimes[processID] else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        do {
            try await store.deleteProcess(id: processID)
        } catch {
            throw storeFailure(error, "delete the process")
        }
        for key in runtime.currentKeys.union(runtime.previousKeys) { processForKey[key] = nil }
        runtimes[processID] = nil
        processByName[NameVersion(name: runtime.process.name, version: runtime.process.version)] = nil
        logger.info("process deleted", metadata: ["process": "\(processID)"])
    }

    /// Whether an admin bearer token is valid (constant-time comparison).
    public nonisolated func isAdmin(token: String?) -> Bool {
        guard let expected = configuration.adminToken, let token else { return false }
        let a = Array(expected.utf8), b = Array(token.utf8)
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for i in 0..<a.count { difference |= a[i] ^ b[i] }
        return difference == 0
    }
}

/// A type-erased generator, so the actor can pass it `inout` to the standard library's generic `random` calls.
private struct ErasedRandom: RandomNumberGenerator, Sendable {
    var base: any RandomNumberGenerator & Sendable
    mutating func next() -> UInt64 { base.next() }
}

/// Folds stored diffs during recovery (called serially by the store's cursor).
private final class RecoveryAccumulator: Sendable {
    private let state: Mutex<(sum: RunningSum, workers: [String])>

    init(sum: RunningSum) { state = Mutex((sum, [])) }

    func add(_ diff: [UInt8], weight: Double, worker: String) {
        state.withLock { state in
            state.sum.add(bytes: diff, weight: weight)
            state.workers.append(worker)
        }
    }

    var result: (RunningSum, [String]) { state.withLock { ($0.sum, $0.workers) } }
}


