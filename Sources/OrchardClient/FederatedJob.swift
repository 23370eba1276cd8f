public import Foundation
import Logging
import OrchardFormats
public import OrchardML
public import OrchardProtocol
public import OrchardScheduler
import Synchronization

/// What ``FederatedJob/run(_:)`` hands the caller's training code: the assignment, the plan and the model.
public struct CycleContext: Sendable {
    /// The assignment (request key, cycle, checkpoint, deadline).
    public let assignment: CycleAssignment
    /// The architecture and training configuration.
    public let plan: OrchardProtocol.TrainingPlan
    /// The model with the cycle's weights.
    public let model: CycleModel
    /// State saved by an earlier, interrupted run of this same cycle, if any.
    public let savedCheckpoint: [UInt8]?
    /// The seed to train with (fixed per cycle).
    public let seed: UInt64
    let saver: @Sendable ([UInt8]) throws(OrchardClientError) -> Void
    let reporter: @Sendable (TrainingStep) -> Void

    /// How to train: batch size, learning rate, epochs, update cap.
    public var clientConfig: ClientConfig { assignment.clientConfig }

    /// Saves local-training state so the next run of this cycle can resume from it (see ``savedCheckpoint``).
    public func saveCheckpoint(_ state: [UInt8]) throws(OrchardClientError) { try saver(state) }

    /// Publishes a training step to the job's observers.
    public func report(progress step: TrainingStep) { reporter(step) }
}

/// One FL process as seen from a device: runs cycles (authenticate, request, download, train, report) with
/// durable state, progress events, and the SwiftSyft-style callbacks.
///
/// Only one cycle runs at a time per job; a second concurrent call waits for the first.
public final class FederatedJob: Sendable {
    /// The process's name.
    public let modelName: String
    /// The process's version.
    public let version: SemanticVersion
    /// The directory holding this job's durable state.
    public let directory: URL
    let client: OrchardClient
    let store: ClientStore
    private let observers = Mutex<[UInt64: AsyncStream<JobEvent>.Continuation]>([:])
    private let nextObserver = Mutex<UInt64>(0)
    let callbacks = Mutex(Callbacks())
    private let gate = CycleGate()

    init(client: OrchardClient, modelName: String, version: SemanticVersion, directory: URL) {
        self.client = client
        self.modelName = modelName
        self.version = version
        self.directory = directory
        store = ClientStore(directory: directory)
    }

    private var configuration: ClientConfiguration { client.configuration }
    private var logger: Logger { client.configuration.logger }

    // MARK: Observation

    /// A stream of this job's events from now on; it ends when the caller stops iterating.
    public func events() -> AsyncStream<JobEvent> {
        let id = nextObserver.withLock { value -> UInt64 in
            value += 1
            return value
        }
        let (stream, continuation) = AsyncStream<JobEvent>.makeStream(bufferingPolicy: .bufferingNewest(1024))
        continuation.onTermination = { [weak self] _ in
            _ = self?.observers.withLock { $0.removeValue(forKey: id) }
        }
        observers.withLock { $0[id] = continuation }
        return stream
    }

    func emit(_ event: JobEvent) {
        let current = observers.withLock { Array($0.values) }
        for continuation in current { continuation.yield(event) }
    }

    // MARK: Running a cycle

    /// Runs one cycle with the caller's training code: uploads a report an earlier window could not deliver
    /// (then returns), otherwise authenticates, requests a cycle, downloads plan and model, calls `body`, and
    /// reports its update.
    ///
    /// The report is written to disk before its upload; if the upload fails, the next run uploads it first,
    /// exactly once (the request key makes a repeated upload harmless).
    /// - Parameters:
    ///   - constraints: Device conditions the cycle needs (read from the configured provider); none by default.
    ///   - body: Trains and returns the update; cancellation should stop it and throw.
    public func run(constraints: TaskConstraints = .none, _ body: @Sendable (CycleContext) async throws -> LocalUpdate) async throws(OrchardClientError) -> CycleOutcome {
        try await gate.exclusive { () async throws(OrchardClientError) -> CycleOutcome in
            let outcome: CycleOutcome
            do throws(OrchardClientError) {
                outcome = try await cycle(constraints: constraints, body)
            } catch {
                emit(.phase(.finished))
                throw error
            }
            emit(.phase(.finished))
            emit(.finished(outcome))
            return outcome
        }
    }

    /// Runs one whole cycle with the configured ``LocalTrainer`` (the Orchard engine by default): trains on
    /// `dataset` under the coordinator's client configuration, computes the diff and reports it.
    ///
    /// Cancelling the task stops training at the next batch boundary and saves a checkpoint; the next run of the
    /// same cycle resumes from it, and a checkpoint of a closed cycle is discarded.
    /// - Parameters:
    ///   - dataset: The device's local samples.
    ///   - constraints: Device conditions the cycle needs; none by default.
    public func train(on dataset: some Dataset, constraints: TaskConstraints = .none) async throws(OrchardClientError) -> CycleOutcome {
        let trainer = configuration.trainer
        return try await run(constraints: constraints) { context in
            let task = LocalTrainingTask(model: context.model, clientConfig: context.clientConfig, seed: context.seed)
            let outcome = try trainer.train(task, on: dataset, resumingFrom: context.savedCheckpoint, progress: { context.report(progress: $0) })
            switch outcome {
            case .completed(let update):
                return update
            case .interrupted(let checkpoint):
                try context.saveCheckpoint(checkpoint)
                throw cancelledError()
            }
        }
    }

    private func cycle(constraints: TaskConstraints, _ body: @Sendable (CycleContext) async throws -> LocalUpdate) async throws(OrchardClientError) -> CycleOutcome {
        if !constraints.isEmpty {
            emit(.phase(.checkingConditions))
            let conditions = await configuration.conditions?.currentConditions() ?? .unknown
            let unmet = configuration.conditionRules.unmet(constraints, kind: .processing, in: conditions)
            if !unmet.isEmpty { return .conditionsNotMet(unmet.map(\.description)) }
        }
        try store.prepare()
        var session = try await currentSession()

        if try store.pendingReport() != nil {
            emit(.phase(.uploadingPendingReport))
            if let receipt = try await uploadPendingReport(session: &session, fromEarlierWindow: true, cycle: nil) {
                return .reported(receipt)
            }
        }

        emit(.phase(.requestingCycle))
        let request = CycleRequest(workerID: session.workerID, processName: modelName, processVersion: version)
        let response = try await call(&session) { transport, token throws(OrchardClientError) in
            try await transport.requestCycle(request, session: token)
        }
        let assignment: CycleAssignment
        switch response {
        case .rejected(let rejection):
            logger.info("cycle request rejected", metadata: ["reason": "\(rejection.reason)", "retry_after": "\(rejection.retryAfter)"])
            return .rejected(retryAfter: rejection.retryAfter, reason: rejection.reason)
        case .accepted(let accepted):
            assignment = accepted
        }

        let saved = try store.checkpoint()
        var resumeState: [UInt8]?
        if let saved {
            if saved.key.requestKey == assignment.requestKey && saved.key.modelID == assignment.modelID {
                resumeState = saved.state
            } else {
                logger.info("discarding the training checkpoint of a closed cycle", metadata: ["cycle": "\(saved.key.cycle)"])
                try store.clearCheckpoint()
            }
        }

        emit(.phase(.downloadingPlan))
        let plan = try await call(&session) { transport, token throws(OrchardClientError) in
            try await transport.plan(assignment.planID, requestKey: assignment.requestKey, session: token)
        }
        do throws(FormatError) {
            try plan.model.validate()
        } catch {
            throw OrchardClientError(.incompatibleModel, "the plan's model cannot be used: \(error.message)")
        }
        if let failure = assignment.clientConfig.validationFailure() {
            throw OrchardClientError(.incompatibleModel, "the coordinator's client configuration is invalid: \(failure)")
        }
        let shapes = try configuration.trainer.parameterShapes(of: plan.model)

        emit(.phase(.downloadingModel))
        let weights = try await downloadModel(assignment, shapes: shapes, session: &session)

        emit(.phase(.training))
        if resumeState != nil { emit(.resumedTraining) }
        let key = ClientStore.CheckpointKey(requestKey: assignment.requestKey, modelID: assignment.modelID, cycle: assignment.cycle)
        let store = self.store
        let context = CycleContext(
            assignment: assignment, plan: plan, model: CycleModel(spec: plan.model, weights: weights), savedCheckpoint: resumeState,
            seed: configuration.trainingSeed &+ UInt64(truncatingIfNeeded: assignment.cycle),
            saver: { state throws(OrchardClientError) in try store.saveCheckpoint(state, key: key) },
            reporter: { [weak self] step in self?.emit(.trained(step)) }
        )
        let update: LocalUpdate
        do {
            update = try await body(context)
        } catch let error as OrchardClientError {
            throw error
        } catch is CancellationError {
            throw cancelledError()
        } catch {
            if Task.isCancelled { throw cancelledError() }
            throw OrchardClientError(.training, "local training failed: \(error)")
        }
        try Self.check(update, against: shapes)

        emit(.phase(.reporting))
        let metadata = ReportMetadata(workerID: session.workerID, requestKey: assignment.requestKey, sampleCount: update.sampleCount, metrics: update.metrics)
        try store.savePendingReport(ReportEnvelope.encode(diff: update.diff, metadata: metadata))
        try store.clearCheckpoint()
        guard let receipt = try await uploadPendingReport(session: &session, fromEarlierWindow: false, cycle: assignment.cycle) else {
            throw OrchardClientError(.serverError, "the coordinator refused the report of cycle \(assignment.cycle)")
        }
        return .reported(receipt)
    }

    /// Checks a caller's update before it is written and sent.
    private static func check(_ update: LocalUpdate, against shapes: [String: [Int]]) throws(OrchardClientError) {
        guard update.sampleCount >= 1 else {
            throw OrchardClientError(.training, "the update's sample count must be at least 1, not \(update.sampleCount)")
        }
        let names = Set(update.diff.map(\.name))
        guard names == Set(shapes.keys), names.count == update.diff.count else {
            throw OrchardClientError(.training, "the diff's tensors \(update.diff.map(\.name).sorted()) are not the model's \(shapes.keys.sorted())")
        }
        for tensor in update.diff {
            guard tensor.shape == shapes[tensor.name] else {
                throw OrchardClientError(.training, "diff tensor '\(tensor.name)' has shape \(tensor.shape), the model's is \(shapes[tensor.name] ?? [])")
            }
            guard tensor.values.allSatisfy(\.isFinite) else {
                throw OrchardClientError(.training, "diff tensor '\(tensor.name)' holds NaN or infinity")
            }
        }
    }

    // MARK: Session

    private func currentSession() async throws(OrchardClientError) -> ClientStore.Identity {
        let now = configuration.environment.now().timeIntervalSince1970
        if let saved = try store.identity(), saved.server == client.server, saved.expiresAt > now + 60 {
            return saved
        }
        return try await authenticate()
    }

    private func authenticate() async throws(OrchardClientError) -> ClientStore.Identity {
        emit(.phase(.authenticating))
        let request = AuthenticateRequest(authToken: client.authToken, processName: modelName, processVersion: version)
        let transport = client.transport
        let response = try await retrying { _ throws(OrchardClientError) in try await transport.authenticate(request) }
        guard WireProtocol.isCompatible(response.protocolVersion) else {
            throw OrchardClientError(.incompatibleModel, "the coordinator speaks protocol \(response.protocolVersion); this client speaks \(WireProtocol.version)")
        }
        let identity = ClientStore.Identity(
            workerID: response.workerID, sessionToken: response.sessionToken,
            expiresAt: configuration.environment.now().timeIntervalSince1970 + response.expiresIn, server: client.server
        )
        try store.saveIdentity(identity)
        return identity
    }

    /// Calls the coordinator with retries; when the session is refused, authenticates once more and repeats.
    private func call<T: Sendable>(
        _ session: inout ClientStore.Identity,
        _ operation: (any ClientTransport, String) async throws(OrchardClientError) -> T
    ) async throws(OrchardClientError) -> T {
        let transport = client.transport
        let token = session.sessionToken
        do throws(OrchardClientError) {
            return try await retrying { _ throws(OrchardClientError) in try await operation(transport, token) }
        } catch where error.code == .authenticationFailed {
            logger.info("session refused; authenticating again")
            try store.clearIdentity()
            session = try await authenticate()
            let renewed = session.sessionToken
            return try await retrying { _ throws(OrchardClientError) in try await operation(transport, renewed) }
        }
    }

    func retrying<T: Sendable>(_ operation: (Int) async throws(OrchardClientError) -> T) async throws(OrchardClientError) -> T {
        try await configuration.retry.run(environment: configuration.environment, onRetry: { [self] error, attempt in
            logger.debug("retrying", metadata: ["attempt": "\(attempt)", "error": "\(error)"])
            emit(.retrying(attempt: attempt, error: error))
        }, operation)
    }

    // MARK: Report

    /// Uploads the report on disk. Returns its receipt; nil when the coordinator can never accept it (its cycle
    /// closed, or it was issued to another worker), in which case it is deleted. Keeps it on transient failure.
    private func uploadPendingReport(session: inout ClientStore.Identity, fromEarlierWindow: Bool, cycle: Int?) async throws(OrchardClientError) -> ReportReceipt? {
        guard let body = try store.pendingReport() else { return nil }
        do throws(OrchardClientError) {
            let response = try await call(&session) { transport, token throws(OrchardClientError) in
                try await transport.report(body, session: token)
            }
            try store.clearPendingReport()
            logger.info("report accepted", metadata: ["cycle": "\(response.cycle)", "reports": "\(response.reportsReceived)"])
            return ReportReceipt(cycle: response.cycle, reportsReceived: response.reportsReceived, retryAfter: response.retryAfter, fromEarlierWindow: fromEarlierWindow)
        } catch where error.serverCode == .reportAlreadyReceived {
            // An earlier upload was committed but its answer was lost: the report already counts once.
            try store.clearPendingReport()
            logger.info("report had already been received")
            guard let cycle else { return nil }
            return ReportReceipt(cycle: cycle, reportsReceived: nil, retryAfter: nil, fromEarlierWindow: fromEarlierWindow)
        } catch where error.code == .serverError && !error.isTransient {
            try store.clearPendingReport()
            logger.warning("report discarded: the coordinator cannot accept it", metadata: ["error": "\(error)"])
            if fromEarlierWindow { return nil }
            throw error
        }
    }

    // MARK: Model download

    /// The model's weights: from the cache, by resuming a partial download, or downloaded afresh; checked
    /// against the plan's parameter shapes.
    private func downloadModel(_ assignment: CycleAssignment, shapes: [String: [Int]], session: inout ClientStore.Identity) async throws(OrchardClientError) -> [TensorRecord] {
        if let cached = try store.model(assignment.modelID), let weights = try? Self.verify(cached, shapes: shapes) {
            emit(.downloaded(bytes: cached.count, of: cached.count))
            return weights
        }
        var restartedAfterCorruption = false
        while true {
            let partial = try store.partialModel(assignment.modelID)
            let request = ModelRequest(modelID: assignment.modelID, requestKey: assignment.requestKey, offset: partial?.length ?? 0, etag: partial?.info.etag)
            do throws(OrchardClientError) {
                try await fetch(request, session: &session)
            } catch where error.serverCode == .rangeNotSatisfiable {
                try store.clearPartialModel()
                continue
            }
            guard let info = try store.partialModel(assignment.modelID) else {
                throw OrchardClientError(.storage, "the downloaded model is missing from \(directory.path)")
            }
            let bytes = try store.partialModelBytes()
            do throws(OrchardClientError) {
                if let total = info.info.totalLength, total != bytes.count {
                    throw OrchardClientError(.incompatibleModel, "the model download holds \(bytes.count) bytes, the server announced \(total)")
                }
                let weights = try Self.verify(bytes, shapes: shapes)
                try store.saveModel(bytes, info: info.info)
                return weights
            } catch {
                try store.clearPartialModel()
                guard !restartedAfterCorruption else { throw error }
                logger.warning("model download failed its integrity check; downloading it again", metadata: ["error": "\(error)"])
                restartedAfterCorruption = true
            }
        }
    }

    /// Downloads into the partial file, retrying transient failures from where the bytes stopped.
    private func fetch(_ first: ModelRequest, session: inout ClientStore.Identity) async throws(OrchardClientError) {
        let store = self.store
        let modelID = first.modelID
        let _: Bool = try await call(&session) { transport, token throws(OrchardClientError) in
            let partial = try store.partialModel(modelID)
            var request = first
            request.offset = partial?.length ?? 0
            request.etag = partial?.info.etag
            let sink = store.partialSink(modelID: modelID)
            defer { sink.close() }
            do throws(OrchardClientError) {
                try await transport.downloadModel(request, session: token, into: sink)
            } catch {
                self.emit(.downloaded(bytes: request.offset + sink.bytesReceived, of: partial?.info.totalLength))
                throw error
            }
            let total = try store.partialModel(modelID)?.info.totalLength
            self.emit(.downloaded(bytes: request.offset + sink.bytesReceived, of: total))
            return true
        }
    }

    /// Decodes model bytes and checks every tensor against the architecture.
    static func verify(_ bytes: [UInt8], shapes: [String: [Int]]) throws(OrchardClientError) -> [TensorRecord] {
        do throws(FormatError) {
            let archive = try Safetensors.decode(bytes)
            try archive.validate(against: shapes)
            for tensor in archive.tensors where !tensor.values.allSatisfy(\.isFinite) {
                throw FormatError(.invalidHeader, "tensor '\(tensor.name)' holds NaN or infinity")
            }
            return archive.tensors
        } catch {
            throw OrchardClientError(.incompatibleModel, "the downloaded model does not fit the plan: \(error.message)")
        }
    }
}

/// Serialises a job's cycles: one at a time, in arrival order.
final class CycleGate: Sendable {
    private let state = Mutex<(busy: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func exclusive<T: Sendable>(_ body: () async throws(OrchardClientError) -> T) async throws(OrchardClientError) -> T {
        await acquire()
        defer { release() }
        return try await body()
    }

    private func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let proceed = state.withLock { state -> Bool in
                if state.busy {
                    state.waiters.append(continuation)
                    return false
                }
                state.busy = true
                return true
            }
            if proceed { continuation.resume() }
        }
    }

    private func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiters.isEmpty {
                state.busy = false
                return nil
            }
            return state.waiters.removeFirst()
        }
        next?.resume()
    }
}
