public import Foundation
import Logging
import OrchardFormats
import OrchardPrivacy
public import OrchardML
public import OrchardProtocol
public import OrchardScheduler
import OrchardSupport
import Synchronization

/// What ``FederatedJob/run(constraints:_:)`` hands the caller's training code: the assignment, the plan and the model.
public struct CycleContext: Sendable {
    /// The assignment (request key, cycle, checkpoint, deadline).
    public let assignment: CycleAssignment
    /// The architecture and training configuration.
    public let plan: TrainingPlan
    /// The model with the cycle's weights.
    public let model: CycleModel
    /// State saved by an earlier, interrupted run of this same cycle, if any.
    public let savedCheckpoint: [UInt8]?
    /// How to train: the plan's settings resolved over the architecture's
    /// (``OrchardML/TrainingConfiguration/resolved(architecture:clientConfig:seed:)``), with the cycle's seed.
    public let training: TrainingConfiguration
    let saver: @Sendable ([UInt8]) throws(OrchardClientError) -> Void
    let reporter: @Sendable (TrainingStep) -> Void
    /// The device's seed of its held-out split.
    let holdoutSeed: UInt64

    /// The process's client config as the plan sent it (``training`` is what it resolves to).
    public var clientConfig: ClientConfig { plan.clientConfig }

    /// The seed to train with (fixed per cycle).
    public var seed: UInt64 { training.seed }

    /// Saves local-training state so the next run of this cycle can resume from it (see ``savedCheckpoint``).
    public func saveCheckpoint(_ state: [UInt8]) throws(OrchardClientError) { try saver(state) }

    /// Publishes a training step to the job's observers.
    public func report(progress step: TrainingStep) { reporter(step) }

    /// The samples of `dataset` to train on: all of them, or those outside the device's held-out split when the process
    /// holds some out (`client_config.holdout_fraction`, ``HoldoutSplit``).
    public func trainingPart<D: Dataset>(of dataset: D) -> DatasetSlice<D> {
        guard let split = holdoutSplit(count: dataset.count) else { return DatasetSlice(dataset, indices: Array(0..<dataset.count)) }
        return split.trainingPart(of: dataset)
    }

    /// The device's split of `count` samples when the process holds data out, else nil.
    public func holdoutSplit(count: Int) -> HoldoutSplit? {
        guard let fraction = clientConfig.holdoutFraction, fraction > 0 else { return nil }
        return HoldoutSplit(count: count, fraction: fraction, seed: holdoutSeed)
    }
}

/// What an evaluation task hands the caller's evaluation code: the task, the plan and the checkpoint to evaluate.
public struct EvaluationContext: Sendable {
    /// The task (request key, checkpoint, deadline).
    public let assignment: EvaluationAssignment
    /// The architecture and the client configuration (with its `holdout_fraction`).
    public let plan: TrainingPlan
    /// The checkpoint's model.
    public let model: CycleModel
    /// The device's seed of its held-out split.
    let holdoutSeed: UInt64

    /// The device's split of `count` samples (nothing held out when the process holds no fraction out).
    public func holdoutSplit(count: Int) -> HoldoutSplit {
        HoldoutSplit(count: count, fraction: plan.clientConfig.holdoutFraction ?? 0, seed: holdoutSeed)
    }
}

/// One FL process as seen from a device: runs cycles (authenticate, request, download, train, report) with
/// durable state, progress events, and the SwiftSyft-style callbacks.
///
/// Only one cycle runs at a time per job; a second concurrent call waits for the first.
public final class FederatedJob: Sendable {
    /// The process's name.
    public let processName: String
    /// The process's version.
    public let version: SemanticVersion
    /// The directory holding this job's durable state.
    public let directory: URL
    let client: CoordinatorConnection
    let store: ClientStore
    private let observers = Mutex<[UInt64: AsyncStream<JobEvent>.Continuation]>([:])
    private let nextObserver = Mutex<UInt64>(0)
    let callbacks = Mutex(Callbacks())
    /// The `holdout_fraction` of the last plan this job downloaded (nil before one): a device that holds nothing out at it
    /// stops offering evaluation, which it could not do, so it takes no evaluation task's place.
    private let planHoldoutFraction = Mutex<Double?>(nil)
    /// One cycle at a time, in arrival order.
    private let gate = AsyncSemaphore(permits: 1)

    init(client: CoordinatorConnection, processName: String, version: SemanticVersion, directory: URL) {
        self.client = client
        self.processName = processName
        self.version = version
        self.directory = directory
        store = ClientStore(directory: directory, durability: client.configuration.durability)
    }

    private var configuration: DeviceConfiguration { client.configuration }
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
    /// exactly once (the request key makes a repeated upload harmless). A process that uses secure aggregation gets
    /// no report: the update (after the plan's local privacy, if any) goes out masked through a
    /// ``SecureAggregationExchange`` whose secrets stay in memory, so a cycle cut short there cannot be resumed.
    /// - Parameters:
    ///   - constraints: Device conditions the cycle needs (read from the configured provider); none by default.
    ///   - body: Trains and returns the update; cancellation should stop it and throw.
    public func run(constraints: TaskConstraints = .none, _ body: @Sendable (CycleContext) async throws -> LocalUpdate) async throws(OrchardClientError)
        -> CycleOutcome
    {
        try await exclusiveCycle(constraints: constraints, tasks: [.training], evaluator: nil) { context in .completed(try await body(context)) }
    }

    /// ``run(constraints:_:)`` for a window that also takes evaluation tasks: `evaluate` runs an evaluation task's
    /// checkpoint on the device's held-out samples (``EvaluationContext/holdoutSplit(count:)``) and returns their
    /// metrics, or nil when it holds none out; `body` should train on ``CycleContext/trainingPart(of:)`` only.
    public func run(
        constraints: TaskConstraints = .none, tasks: [DeviceTask], evaluate: @escaping @Sendable (EvaluationContext) async throws -> EvaluationMetrics?,
        _ body: @Sendable (CycleContext) async throws -> LocalUpdate
    ) async throws(OrchardClientError) -> CycleOutcome {
        let evaluator: Evaluator = { context async throws(OrchardClientError) -> EvaluationMetrics? in
            do { return try await evaluate(context) } catch let error as OrchardClientError { throw error } catch is CancellationError {
                throw OrchardClientError(.cancelled, "the evaluation was cancelled")
            } catch {
                throw OrchardClientError(.training, "evaluation failed: \(error)")
            }
        }
        return try await exclusiveCycle(constraints: constraints, tasks: tasks, evaluator: evaluator) { context in .completed(try await body(context)) }
    }

    /// Runs one whole cycle with the configured ``LocalTrainer`` (the Orchard engine by default): trains on
    /// `dataset` under the coordinator's client configuration, computes the diff and reports it.
    ///
    /// When the process holds data out (`client_config.holdout_fraction`), training sees only the samples outside the
    /// device's held-out split (``HoldoutSplit``); with `.evaluation` among `tasks`, the
    /// coordinator may first give the window an evaluation task — the latest checkpoint run on the held-out split, its
    /// metrics sent, no update — after which the window asks again for training (an evaluation is cheap: a short window
    /// can take `tasks: [.evaluation]` alone).
    ///
    /// Cancelling the task stops training at the next batch boundary and saves a checkpoint; the next run of the
    /// same cycle resumes from it, and a checkpoint of a closed cycle is discarded.
    /// - Parameters:
    ///   - dataset: The device's local samples.
    ///   - constraints: Device conditions the cycle needs; none by default.
    ///   - tasks: The tasks this window takes; both by default.
    public func train(on dataset: some Dataset, constraints: TaskConstraints = .none, tasks: [DeviceTask] = [.evaluation, .training])
        async throws(OrchardClientError) -> CycleOutcome
    {
        let trainer = configuration.trainer
        var tasks = tasks
        if tasks.contains(.evaluation), let fraction = planHoldoutFraction.withLock({ $0 }),
            HoldoutSplit(count: dataset.count, fraction: fraction, seed: configuration.trainingSeed).holdout.isEmpty
        {
            // Nothing held out at the process's fraction: an evaluation task could not be done.
            tasks.removeAll { $0 == .evaluation }
            if tasks.isEmpty {
                // Asked again in an hour: the device's data may have grown by then.
                let outcome = CycleOutcome.rejected(retryAfter: 3600, reason: "nothing_held_out")
                emit(.phase(.finished))
                emit(.finished(outcome))
                return outcome
            }
        }
        let evaluator: Evaluator = { context async throws(OrchardClientError) -> EvaluationMetrics? in
            let holdout = context.holdoutSplit(count: dataset.count).holdoutPart(of: dataset)
            guard holdout.count > 0 else { return nil }
            return try await trainer.evaluate(context.model, on: holdout)
        }
        return try await exclusiveCycle(constraints: constraints, tasks: tasks, evaluator: evaluator) { context in
            let task = LocalTrainingTask(model: context.model, training: context.training)
            let part = context.trainingPart(of: dataset)
            guard part.count > 0 else {
                throw OrchardClientError(.training, "every one of the device's \(dataset.count) samples is held out for evaluation; none is left to train on")
            }
            // An interruption's checkpoint is saved by the state machine (`trainingEnded(.interrupted)`).
            if part.count == dataset.count {
                return try await trainer.train(task, on: dataset, resumingFrom: context.savedCheckpoint, progress: { context.report(progress: $0) })
            }
            return try await trainer.train(task, on: part, resumingFrom: context.savedCheckpoint, progress: { context.report(progress: $0) })
        }
    }

    /// Runs one cycle at a time and publishes its end to observers.
    private func exclusiveCycle(
        constraints: TaskConstraints, tasks: [DeviceTask], evaluator: Evaluator?, _ body: @Sendable (CycleContext) async throws -> LocalTrainingOutcome
    ) async throws(OrchardClientError) -> CycleOutcome {
        // A window that expires while another cycle of the job holds the gate stops waiting at once (within its grace).
        do { try await gate.waitUnlessCancelled() } catch { throw cancelledError() }
        defer { gate.signal() }
        let outcome: CycleOutcome
        do throws(OrchardClientError) {
            outcome = try await cycle(constraints: constraints, tasks: evaluator == nil ? tasks.filter { $0 != .evaluation } : tasks, evaluator, body)
        } catch {
            emit(.phase(.finished))
            throw error
        }
        emit(.phase(.finished))
        emit(.finished(outcome))
        return outcome
    }

    /// Drives a ``JobCycleStateMachine``: performs its actions (files, coordinator calls, training, backoff)
    /// and feeds each result back, until it finishes or fails.
    private func cycle(
        constraints: TaskConstraints, tasks: [DeviceTask], _ evaluator: Evaluator?, _ body: @Sendable (CycleContext) async throws -> LocalTrainingOutcome
    ) async throws(OrchardClientError) -> CycleOutcome {
        guard !tasks.isEmpty else { throw OrchardClientError(.invalidConfiguration, "a window must take at least one task (training or evaluation)") }
        var machine = JobCycleStateMachine(
            setup: JobCycleStateMachine.Setup(
                server: client.server, authToken: client.authToken, processName: processName, version: version,
                retry: configuration.retry, conditionRules: configuration.conditionRules, trainingSeed: configuration.trainingSeed,
                secureAggregationWait: configuration.secureAggregationWait, tasks: tasks
            ))
        var actions = machine.start(constraints: constraints)
        while true {
            var next: [JobCycleStateMachine.Action]?
            // Each action is dropped once performed, so that what it carried (the report just written to disk, the model
            // just kept) is not held in memory through the batch's last action, a coordinator call that may take long.
            var batch = Array(actions.reversed())
            actions = []
            while let action = batch.popLast() {
                precondition(next == nil, "a request must be the last action of a batch")
                switch action {
                case .finish(let outcome): return outcome
                case .fail(let error): throw error
                default: next = try await perform(action, on: &machine, evaluator, body)
                }
            }
            guard let next else { preconditionFailure("the job cycle state machine stopped without an outcome") }
            actions = next
        }
    }

    /// Performs one action. Returns the machine's next actions for a request, nil for an effect.
    private func perform(
        _ action: JobCycleStateMachine.Action, on machine: inout JobCycleStateMachine, _ evaluator: Evaluator?,
        _ body: @Sendable (CycleContext) async throws -> LocalTrainingOutcome
    ) async throws(OrchardClientError) -> [JobCycleStateMachine.Action]? {
        let transport = client.transport
        switch action {
        case .emit(let event): emit(event)
        case .log(let level, let message): logger.log(level: level, "\(message)")
        case .saveSession(let identity): try store.saveIdentity(identity)
        case .clearSession: try store.clearIdentity()
        case .savePendingReport(let body): try store.savePendingReport(body)
        case .clearPendingReport: try store.clearPendingReport()
        case .saveCheckpoint(let state, let key): try store.saveCheckpoint(state, key: key)
        case .discardCheckpoint: try store.clearCheckpoint()
        case .discardPartialModel: try store.clearPartialModel()
        case .keepModel(let bytes, let info): try store.saveModel(bytes, info: info)

        case .readConditions:
            return machine.conditionsRead(await configuration.conditions?.currentConditions() ?? .unknown)
        case .loadState:
            try store.prepare()
            let stored = JobCycleStateMachine.Stored(
                session: try store.identity(), hasPendingReport: try store.pendingReport() != nil, checkpoint: try store.checkpoint())
            return machine.stateLoaded(stored, now: now)
        case .loadCachedModel(let modelID):
            let cached = try store.model(modelID)
            return machine.cachedModelLoaded(cached?.bytes, info: cached?.info)
        case .backoff(let retry, let seconds):
            let delay =
                seconds.map { Duration.nanoseconds(Int64($0 * 1e9)) }
                ?? configuration.retry.delay(beforeRetry: retry, random: configuration.environment.random())
            do {
                try await configuration.environment.clock.sleep(for: delay)
            } catch {
                return machine.requestFailed(cancelledError())
            }
            return machine.backoffElapsed()

        case .authenticate(let request):
            let client = self.client
            return await call(
                &machine,
                { () async throws(OrchardClientError) in
                    var request = request
                    // A provider's token is asked for now, when it is needed: the one from the last window may have expired.
                    if client.tokenProvider != nil { request.authToken = try await client.currentAuthToken() }
                    return try await transport.authenticate(request)
                }
            ) { machine, response in
                machine.authenticated(response, now: now)
            }
        case .uploadReport(let session):
            let store = self.store
            return await call(
                &machine,
                { () async throws(OrchardClientError) in
                    // Read from disk when the transport sends it, not held while it waits.
                    let missing = OrchardClientError(.storage, "the report to upload is missing from \(store.directory.path)")
                    guard let size = store.pendingReportSize() else { throw missing }
                    return try await transport.report(
                        byteCount: size,
                        body: { () throws(OrchardClientError) -> [UInt8] in
                            guard let body = try store.pendingReport() else { throw missing }
                            return body
                        }, session: session)
                }
            ) { machine, response in machine.reportAnswered(response) }
        case .measureLinkSpeed(let session, let downloadBytes, let uploadBytes):
            var test = configuration.linkSpeedTest
            if let downloadBytes { test.downloadBytes = downloadBytes }
            if let uploadBytes { test.uploadBytes = uploadBytes }
            return await call(&machine, { () async throws(OrchardClientError) in try await test.measure(over: transport, session: session) }) {
                machine, speed in
                machine.linkSpeedMeasured(speed)
            }
        case .requestCycle(let request, let session):
            return await call(&machine, { () async throws(OrchardClientError) in try await transport.requestCycle(request, session: session) }) {
                machine, response in
                machine.cycleAnswered(response)
            }
        case .downloadPlan(let planID, let requestKey, let session):
            let trainer = configuration.trainer
            return await call(
                &machine,
                { () async throws(OrchardClientError) in
                    let plan = try await transport.plan(planID, requestKey: requestKey, session: session)
                    return (plan, try trainer.parameterShapes(of: plan.model))
                }
            ) { machine, answer in
                planHoldoutFraction.withLock { $0 = answer.0.clientConfig.holdoutFraction ?? 0 }
                return machine.planDownloaded(answer.0, shapes: answer.1)
            }
        case .downloadModel(let modelID, let requestKey, let session):
            let store = self.store
            return await call(
                &machine,
                { () async throws(OrchardClientError) in
                    try await fetch(ModelRequest(modelID: modelID, requestKey: requestKey), session: session)
                    guard let partial = try store.partialModel(modelID) else {
                        throw OrchardClientError(.storage, "the downloaded model is missing from \(store.directory.path)")
                    }
                    return (try store.partialModelBytes(), partial.info)
                }
            ) { machine, download in machine.modelDownloaded(download.0, info: download.1) }
        case .train(let input):
            let store = self.store
            let key = input.checkpointKey
            let context = CycleContext(
                assignment: input.assignment, plan: input.plan, model: input.model, savedCheckpoint: input.resumeState, training: input.training,
                saver: { state throws(OrchardClientError) in try store.saveCheckpoint(state, key: key) },
                reporter: { [weak self] step in self?.emit(.trained(step)) }, holdoutSeed: configuration.trainingSeed
            )
            do {
                var outcome = try await body(context)
                if case .completed(let update) = outcome, let privacy = input.plan.localPrivacy {
                    var generator = configuration.environment.noiseGenerator
                    let frozen = Set(input.plan.model.layers.filter(\.frozen).map(\.name))
                    outcome = .completed(try LocalDifferentialPrivacy.apply(privacy, to: update, frozenLayers: frozen, using: &generator))
                }
                return machine.trainingEnded(outcome)
            } catch let error as OrchardClientError {
                return machine.trainingFailed(error)
            } catch is CancellationError {
                return machine.trainingFailed(cancelledError())
            } catch {
                return machine.trainingFailed(Task.isCancelled ? cancelledError() : OrchardClientError(.training, "local training failed: \(error)"))
            }
        case .secureAggregate(let input):
            do throws(OrchardClientError) {
                return machine.secureAggregationEnded(try await secureAggregate(input))
            } catch {
                return machine.secureAggregationFailed(error)
            }
        case .evaluate(let input):
            guard let evaluator else { return machine.evaluationFailed(OrchardClientError(.invalidConfiguration, "this window takes no evaluation")) }
            do throws(OrchardClientError) {
                try checkCancellation()
                let context = EvaluationContext(assignment: input.assignment, plan: input.plan, model: input.model, holdoutSeed: configuration.trainingSeed)
                return machine.evaluationEnded(try await evaluator(context))
            } catch {
                return machine.evaluationFailed(Task.isCancelled && error.code != .cancelled ? cancelledError() : error)
            }
        case .uploadEvaluation(let report, let session):
            return await call(&machine, { () async throws(OrchardClientError) in try await transport.evaluationReport(report, session: session) }) {
                machine, response in
                machine.evaluationAnswered(response)
            }
        case .finish, .fail:
            preconditionFailure("terminal actions end the cycle in the driver")
        }
        return nil
    }

    /// Drives a ``SecureAggregationExchange``: its requests through the transport, its waits on the environment's
    /// clock, its randomness from the environment's noise generator (cryptographically secure unless seeded for a
    /// simulation). Cancellation during a call or a wait ends it as cancelled; the secrets are never written.
    private func secureAggregate(_ input: JobCycleStateMachine.SecureAggregationInput) async throws(OrchardClientError) -> CycleOutcome {
        let transport = client.transport
        let environment = configuration.environment
        var generator = environment.noiseGenerator
        var exchange = try SecureAggregationExchange(
            plan: input.plan, processID: input.assignment.processID, cycle: input.assignment.cycle, workerID: input.workerID,
            requestKey: input.assignment.requestKey, update: input.update, sampleCount: input.sampleCount, retry: configuration.retry,
            waitLimit: input.waitLimit, identity: configuration.secureAggregationIdentity,
            trust: configuration.secureAggregationAuthorities.isEmpty
                ? nil : SecureAggregationTrust(authorityPublicKeys: configuration.secureAggregationAuthorities, now: environment.clock.date),
            using: &generator
        )
        var action = exchange.start()
        // The masks are expanded off the critical path once the shares are sent, while the device waits for the
        // masked_input stage (the largest computation of the protocol): on a Dispatch thread, not the cooperative pool,
        // whose threads would otherwise sit in it while this device's and others' answers wait. Its result is dropped
        // if the exchange ends first.
        var masks: Task<SecureAggregationPrecomputedMask?, Never>?
        defer { masks?.cancel() }
        while true {
            if masks == nil, let plan = exchange.maskPlan {
                masks = Task.detached(priority: .utility) {
                    try? await offCooperativePool(qos: .utility) { () throws(SecureAggregationError) in try plan.compute() }
                }
            }
            switch action {
            case .send(let request):
                do throws(OrchardClientError) {
                    try checkCancellation()
                    let reply = try await transport.secureAggregation(request, session: input.session)
                    try checkCancellation()
                    if reply.next == .maskedInput, let pending = masks, let mask = await pending.value { exchange.provide(mask) }
                    action = exchange.replied(reply, using: &generator)
                } catch {
                    if Task.isCancelled || error.code == .cancelled { throw cancelledError() }
                    action = exchange.requestFailed(error, random: environment.random())
                }
            case .wait(let seconds):
                try await pause(seconds, clock: environment.clock)
                action = exchange.waitElapsed()
            case .backoff(let retry, let seconds, let error):
                logger.debug("secure aggregation: retry \(retry) after \(error)")
                emit(.retrying(attempt: retry, error: error))
                try await pause(seconds, clock: environment.clock)
                action = exchange.waitElapsed()
            case .finished(let outcome):
                return outcome
            case .failed(let error):
                logger.warning("secure aggregation failed in cycle \(input.assignment.cycle): \(error)")
                throw error
            }
        }
    }

    /// Sleeps on the injected clock; cancellation ends the sleep as ``OrchardClientError/Code/cancelled``.
    private func pause(_ seconds: Double, clock: any WallClock) async throws(OrchardClientError) {
        do {
            try await clock.sleep(for: .nanoseconds(Int64(min(max(seconds, 0), 1e9) * 1e9)))
        } catch {
            throw cancelledError()
        }
        try checkCancellation()
    }

    /// Runs an evaluation task's checkpoint on the held-out split (nil: nothing held out).
    typealias Evaluator = @Sendable (EvaluationContext) async throws(OrchardClientError) -> EvaluationMetrics?

    /// The current time in seconds since 1970, from the injected environment.
    private var now: Double { configuration.environment.clock.date.timeIntervalSince1970 }

    /// Makes one attempt at a coordinator call and hands its answer, or its failure, to the machine. A call
    /// made or failed while the task is cancelled counts as cancelled.
    private func call<T: Sendable>(
        _ machine: inout JobCycleStateMachine, _ operation: () async throws(OrchardClientError) -> T,
        then handle: (inout JobCycleStateMachine, T) -> [JobCycleStateMachine.Action]
    ) async -> [JobCycleStateMachine.Action] {
        do throws(OrchardClientError) {
            try checkCancellation()
            let answer = try await operation()
            return handle(&machine, answer)
        } catch {
            return machine.requestFailed(Task.isCancelled && error.code != .cancelled ? cancelledError() : error)
        }
    }

    // MARK: Model download

    /// Downloads into the partial file from where its bytes stop (with the entity tag they belong to).
    private func fetch(_ first: ModelRequest, session: String) async throws(OrchardClientError) {
        let partial = try store.partialModel(first.modelID)
        var request = first
        request.offset = partial?.length ?? 0
        request.etag = partial?.info.etag
        let sink = store.partialSink(modelID: first.modelID)
        defer { sink.close() }
        do throws(OrchardClientError) {
            try await client.transport.downloadModel(request, session: session, into: sink)
        } catch {
            emit(.downloaded(bytes: request.offset + sink.bytesReceived, of: partial?.info.totalLength))
            throw error
        }
        let total = try store.partialModel(first.modelID)?.info.totalLength
        emit(.downloaded(bytes: request.offset + sink.bytesReceived, of: total))
    }
}
