import Foundation
import Logging
import OrchardFormats
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import OrchardScheduler
import OrchardSupport

/// One job cycle as a pure state machine: check conditions → upload a report kept from an earlier window →
/// authenticate → measure the link when the process asks for link speeds → request a cycle → download plan and
/// model (resumable, verified) → train (resuming a checkpoint of the same cycle) → keep the report on disk →
/// upload it. Under secure aggregation (``OrchardProtocol/TrainingPlan/secureAggregation``) the update is neither kept
/// on disk nor uploaded: the driver runs a ``SecureAggregationExchange`` instead, whose secrets live only in memory.
///
/// Every `mutating func` takes what happened and returns the actions to perform, in order. Effects (emit an
/// event, write or delete a file, log) need no answer; the last action of a batch is either a request, whose
/// result the driver feeds back through the matching handler, or a terminal ``Action/finish(_:)`` /
/// ``Action/fail(_:)``. The machine performs no I/O, reads no clock and draws no random numbers: the driver
/// (``FederatedJob``) passes time in and computes backoff delays.
struct JobCycleStateMachine {
    /// What the machine needs to know about the job.
    struct Setup: Sendable {
        /// The coordinator's name; a saved session is reused only with the same one.
        var server: String
        /// The device's credential.
        var authToken: String?
        /// The FL process's name.
        var processName: String
        /// The FL process's version.
        var version: SemanticVersion
        /// How often transient failures are retried.
        var retry: RequestRetryPolicy
        /// Thresholds for constraints.
        var conditionRules: ConditionRules
        /// The base seed of local training.
        var trainingSeed: UInt64
        /// How long a secure-aggregation exchange waits for the other devices at most.
        var secureAggregationWait = SecureAggregationWaitLimit()
        /// The tasks the device takes in this window (an evaluation task first, then training, when both).
        var tasks: [DeviceTask] = [.training]
    }

    /// What a saved session must still have left to be reused, in seconds.
    static let sessionMargin: Double = 60

    /// The durable state the cycle starts from.
    struct Stored: Sendable {
        /// The saved session, if any.
        var session: ClientStore.Identity?
        /// Whether a report from an earlier window waits for upload.
        var hasPendingReport: Bool
        /// The saved local-training checkpoint, if any.
        var checkpoint: (key: ClientStore.CheckpointKey, state: [UInt8])?
    }

    /// Everything the training step needs.
    struct TrainingInput: Sendable {
        var assignment: CycleAssignment
        var plan: TrainingPlan
        var model: CycleModel
        /// The checkpoint of an interrupted run of this same cycle.
        var resumeState: [UInt8]?
        /// The settings resolved from the plan, with the cycle's seed.
        var training: TrainingConfiguration
        /// What a checkpoint saved during this run belongs to.
        var checkpointKey: ClientStore.CheckpointKey
    }

    /// Everything an evaluation task needs: the checkpoint to run on the held-out split.
    struct EvaluationInput: Sendable {
        var assignment: EvaluationAssignment
        var plan: TrainingPlan
        var model: CycleModel
    }

    /// Everything a secure-aggregation exchange needs (``SecureAggregationExchange``).
    struct SecureAggregationInput: Sendable {
        var assignment: CycleAssignment
        var plan: SecureAggregationPlan
        /// The worker and its session token.
        var workerID: String
        var session: String
        /// The update flattened in the coordinator's layout order (``SecureAggregationExchange/flatten(_:)``).
        var update: [Float]
        var sampleCount: Int
        /// The most seconds the exchange waits in all.
        var waitLimit: Double
    }

    /// What the driver does next.
    enum Action: Sendable {
        // Effects: performed in order, no answer.
        /// Publishes an event to the job's observers.
        case emit(JobEvent)
        /// Writes a log line.
        case log(Logger.Level, String)
        /// Persists the session.
        case saveSession(ClientStore.Identity)
        /// Deletes the saved session.
        case clearSession
        /// Writes a report body to disk before its upload.
        case savePendingReport([UInt8])
        /// Deletes the report on disk.
        case clearPendingReport
        /// Saves local-training state.
        case saveCheckpoint([UInt8], ClientStore.CheckpointKey)
        /// Deletes the saved local-training state.
        case discardCheckpoint
        /// Deletes the partial model download, so the next download starts from byte zero.
        case discardPartialModel
        /// Keeps verified model bytes and drops the partial download.
        case keepModel([UInt8], ClientStore.ModelInfo)

        // Requests: the driver answers each through the named handler, or ``requestFailed(_:)``.
        /// Read the device's conditions → ``conditionsRead(_:)``.
        case readConditions
        /// Read the job's durable state → ``stateLoaded(_:now:)``.
        case loadState
        /// Authenticate → ``authenticated(_:now:)``.
        case authenticate(AuthenticateRequest)
        /// Upload the report on disk → ``reportAnswered(_:)``.
        case uploadReport(session: String)
        /// Time a download and an upload against the coordinator's speed-test endpoint, of the sizes the coordinator
        /// announced (nil: the client's own); answer with ``JobCycleStateMachine/linkSpeedMeasured(_:)``.
        case measureLinkSpeed(session: String, downloadBytes: Int?, uploadBytes: Int?)
        /// Ask for a cycle → ``cycleAnswered(_:)``.
        case requestCycle(CycleRequest, session: String)
        /// Download the plan → ``planDownloaded(_:shapes:)``.
        case downloadPlan(planID: String, requestKey: String, session: String)
        /// Read the completely downloaded model of this id, if kept → ``cachedModelLoaded(_:info:)``.
        case loadCachedModel(modelID: String)
        /// Download the model, resuming the partial file when there is one → ``modelDownloaded(_:info:)``.
        case downloadModel(modelID: String, requestKey: String, session: String)
        /// Wait before retry number `retry` → ``backoffElapsed()``: `seconds` when the coordinator said how long
        /// (`Retry-After`), else the retry policy's backoff.
        case backoff(retry: Int, seconds: Double?)
        /// Train → ``trainingEnded(_:)`` or ``trainingFailed(_:)``.
        case train(TrainingInput)
        /// Run the secure-aggregation exchange → ``secureAggregationEnded(_:)`` or ``secureAggregationFailed(_:)``.
        case secureAggregate(SecureAggregationInput)
        /// Evaluate the checkpoint on the held-out split → ``evaluationEnded(_:)`` or ``evaluationFailed(_:)``.
        case evaluate(EvaluationInput)
        /// Send the evaluation's result → ``evaluationAnswered(_:)``.
        case uploadEvaluation(EvaluationReport, session: String)

        // Terminal.
        /// The cycle ended with an outcome.
        case finish(CycleOutcome)
        /// The cycle failed.
        case fail(OrchardClientError)
    }

    /// A coordinator call, repeated after a backoff or a renewed session.
    enum Call: Sendable, Hashable {
        case authenticate
        case uploadReport(fromEarlierWindow: Bool)
        case measureLinkSpeed
        case requestCycle
        case downloadPlan
        case downloadModel
        case uploadEvaluation
    }

    /// Where the cycle is.
    enum Phase: Sendable, Hashable {
        case idle, checkingConditions, loading, calling(Call), backingOff(Call), training, secureAggregating, evaluating, done
    }

    let setup: Setup
    private(set) var phase: Phase = .idle
    private var constraints: TaskConstraints = .none
    private var session: ClientStore.Identity?
    private var hasPendingReport = false
    private var savedCheckpoint: (key: ClientStore.CheckpointKey, state: [UInt8])?
    private var assignment: CycleAssignment?
    private var plan: TrainingPlan?
    private var training: TrainingConfiguration?
    private var shapes: [String: [Int]] = [:]
    private var resumeState: [UInt8]?
    /// The attempt number of the current call, from 1.
    private var attempt = 1
    /// Whether the current call already renewed a refused session.
    private var renewedSession = false
    /// The call to repeat once authentication (after a refused session) succeeds.
    private var callAfterAuthentication: Call?
    /// Whether a download that failed its integrity check was restarted from byte zero.
    private var restartedAfterCorruption = false
    /// Whether a download whose range the server could not serve was restarted from byte zero.
    private var restartedAfterBadRange = false
    /// Whether the assignment was asked for again after its model was superseded (once per window).
    private var refreshedAssignment = false
    /// The link speeds measured for this cycle's request, when the process asks for them.
    private var linkSpeed: LinkSpeed?
    /// Whether the cycle request after the current measurement repeats one refused for its session.
    private var requestRepeatsRefused = false
    /// The evaluation task in hand, if the coordinator gave one.
    private var evaluation: EvaluationAssignment?
    /// The result of that task, while it is sent.
    private var evaluationResult: EvaluationReport?
    /// The tasks the next cycle request offers to take.
    private var requestTasks: [DeviceTask]

    init(setup: Setup) {
        self.setup = setup
        requestTasks = setup.tasks
    }

    // MARK: Handlers

    /// Begins a cycle that needs `constraints`.
    mutating func start(constraints: TaskConstraints) -> [Action] {
        precondition(phase == .idle, "a cycle state machine runs one cycle")
        self.constraints = constraints
        if constraints.isEmpty { return load() }
        phase = .checkingConditions
        return [.emit(.phase(.checkingConditions)), .readConditions]
    }

    /// The device's conditions were read.
    mutating func conditionsRead(_ conditions: DeviceConditions) -> [Action] {
        expect(.checkingConditions)
        let unmet = setup.conditionRules.unmet(constraints, kind: .processing, in: conditions)
        if !unmet.isEmpty { return finish(.conditionsNotMet(unmet.map(\.description))) }
        return load()
    }

    /// The job's durable state was read, at `now` (seconds since 1970).
    mutating func stateLoaded(_ stored: Stored, now: Double) -> [Action] {
        expect(.loading)
        hasPendingReport = stored.hasPendingReport
        savedCheckpoint = stored.checkpoint
        if let saved = stored.session, saved.server == setup.server, saved.expiresAt > now + Self.sessionMargin, saved.requiresSpeedTest != nil {
            session = saved
            return afterSession()
        }
        return issue(.authenticate)
    }

    /// The coordinator authenticated the device at `now` (seconds since 1970).
    mutating func authenticated(_ response: AuthenticateResponse, now: Double) -> [Action] {
        expect(.calling(.authenticate))
        guard WireProtocol.isCompatible(response.protocolVersion) else {
            return fail(
                OrchardClientError(
                    .incompatibleModel, "the coordinator speaks protocol \(response.protocolVersion); this client speaks \(WireProtocol.version)"))
        }
        let identity = ClientStore.Identity(
            workerID: response.workerID, sessionToken: response.sessionToken, expiresAt: now + response.expiresIn, server: setup.server,
            requiresSpeedTest: response.requiresSpeedTest, speedTestDownloadBytes: response.speedTestDownloadBytes,
            speedTestUploadBytes: response.speedTestUploadBytes
        )
        session = identity
        var actions: [Action] = [.saveSession(identity)]
        if let repeated = callAfterAuthentication {
            callAfterAuthentication = nil
            // A renewed session may be the first to say the process wants link speeds.
            if repeated == .requestCycle && needsLinkSpeed {
                requestRepeatsRefused = true
                actions += measureOrRequestCycle()
            } else {
                actions += issue(repeated, renewed: true)
            }
        } else {
            actions += afterSession()
        }
        return actions
    }

    /// The coordinator accepted the report on disk.
    mutating func reportAnswered(_ response: ReportResponse) -> [Action] {
        guard case .calling(.uploadReport(let fromEarlierWindow)) = phase else { unexpected("a report answer") }
        let receipt = ReportReceipt(
            cycle: response.cycle, reportsReceived: response.reportsReceived, retryAfter: response.retryAfter, fromEarlierWindow: fromEarlierWindow)
        return [.clearPendingReport, .log(.info, "report accepted: cycle \(response.cycle), \(response.reportsReceived) reports")] + finish(.reported(receipt))
    }

    /// The link was measured for the cycle request.
    mutating func linkSpeedMeasured(_ speed: LinkSpeed) -> [Action] {
        expect(.calling(.measureLinkSpeed))
        linkSpeed = speed
        return [.log(.info, "link speed: \(speed)"), .emit(.phase(.requestingCycle))] + issue(.requestCycle, renewed: requestRepeatsRefused)
    }

    /// The coordinator answered the cycle request.
    mutating func cycleAnswered(_ response: CycleResponse) -> [Action] {
        expect(.calling(.requestCycle))
        switch response {
        case .rejected(let rejection):
            return [.log(.info, "cycle request rejected (\(rejection.reason)); retry after \(rejection.retryAfter) s")]
                + finish(.rejected(retryAfter: rejection.retryAfter, reason: rejection.reason))
        case .evaluate(let task):
            guard requestTasks.contains(.evaluation) else {
                return fail(OrchardClientError(.serverError, "the coordinator gave an evaluation task to a request that did not offer evaluation"))
            }
            evaluation = task
            return [.log(.info, "evaluation task for checkpoint \(task.checkpoint)"), .emit(.phase(.downloadingPlan))] + issue(.downloadPlan)
        case .accepted(let accepted) where !requestTasks.contains(.training):
            // A coordinator before protocol 2.5 ignores `tasks`: a window that takes no training does not start it.
            return [.log(.info, "admitted to cycle \(accepted.cycle) by a coordinator that does not take evaluation-only requests; not training")]
                + finish(.rejected(retryAfter: accepted.reportWithin, reason: "training_not_taken"))
        case .accepted(let accepted):
            assignment = accepted
            var actions: [Action] = []
            // Matched against every assignment of the window: a refreshed one (a superseded checkpoint) may name
            // another model, whose training cannot resume from this one's state.
            resumeState = nil
            if let saved = savedCheckpoint {
                if saved.key.requestKey == accepted.requestKey && saved.key.modelID == accepted.modelID {
                    resumeState = saved.state
                } else {
                    actions += [
                        .log(.info, "discarding the training checkpoint of cycle \(saved.key.cycle), model \(saved.key.modelID): the assignment is another"),
                        .discardCheckpoint,
                    ]
                    savedCheckpoint = nil
                }
            }
            return actions + [.emit(.phase(.downloadingPlan))] + issue(.downloadPlan)
        }
    }

    /// The plan arrived; `shapes` are its parameter shapes as the local trainer builds them.
    mutating func planDownloaded(_ plan: TrainingPlan, shapes: [String: [Int]]) -> [Action] {
        expect(.calling(.downloadPlan))
        do throws(FormatError) {
            try plan.model.validate()
        } catch {
            let problem = OrchardClientError(.incompatibleModel, "the plan's model cannot be used: \(error.message)")
            return evaluation == nil ? fail(problem) : dropEvaluation(problem)
        }
        if let evaluation {
            self.plan = plan
            self.shapes = shapes
            phase = .loading
            return [.emit(.phase(.downloadingModel)), .loadCachedModel(modelID: evaluation.modelID)]
        }
        guard let assignment else { unexpected("a plan without an assignment") }
        do throws(OrchardClientError) {
            training = try TrainingConfiguration.resolved(
                architecture: plan.model, clientConfig: plan.clientConfig, seed: setup.trainingSeed &+ UInt64(truncatingIfNeeded: assignment.cycle)
            )
        } catch {
            return fail(error)
        }
        self.plan = plan
        self.shapes = shapes
        phase = .loading
        return [.emit(.phase(.downloadingModel)), .loadCachedModel(modelID: assignment.modelID)]
    }

    /// The complete model kept from an earlier download, if there is one for this model id.
    mutating func cachedModelLoaded(_ bytes: [UInt8]?, info: ClientStore.ModelInfo?) -> [Action] {
        expect(.loading)
        if let bytes, let info,
            let weights = try? ModelIntegrity.verify(bytes, sha256: info.sha256.map { [UInt8]($0) }, totalLength: info.totalLength, shapes: shapes)
        {
            return [.emit(.downloaded(bytes: bytes.count, of: bytes.count))] + beginTraining(weights)
        }
        return issue(.downloadModel)
    }

    /// The model download finished; `bytes` is the whole file (resumed parts included), `info` what the
    /// coordinator announced for it.
    mutating func modelDownloaded(_ bytes: [UInt8], info: ClientStore.ModelInfo) -> [Action] {
        expect(.calling(.downloadModel))
        do throws(OrchardClientError) {
            let weights = try ModelIntegrity.verify(bytes, sha256: info.sha256.map { [UInt8]($0) }, totalLength: info.totalLength, shapes: shapes)
            return [.keepModel(bytes, info)] + beginTraining(weights)
        } catch {
            guard !restartedAfterCorruption else { return [.discardPartialModel] + fail(error) }
            restartedAfterCorruption = true
            return [.log(.warning, "model download failed its integrity check; downloading it again from byte zero: \(error)"), .discardPartialModel]
                + issue(.downloadModel)
        }
    }

    /// The evaluation task ran: the metrics on the held-out split, or nil when the device holds no sample out.
    mutating func evaluationEnded(_ metrics: EvaluationMetrics?) -> [Action] {
        expect(.evaluating)
        guard let evaluation, let session else { unexpected("an evaluation without a task") }
        guard let metrics, metrics.samples > 0 else {
            return [.log(.info, "no held-out samples: the evaluation task of checkpoint \(evaluation.checkpoint) is left")] + afterEvaluation(nil)
        }
        var values = metrics.values.filter { $0.value.isFinite }
        values["loss"] = metrics.loss
        guard metrics.loss.isFinite else {
            return dropEvaluation(OrchardClientError(.diverged, "the checkpoint's loss on the held-out split is not finite"))
        }
        let report = EvaluationReport(
            workerID: session.workerID, requestKey: evaluation.requestKey, samples: metrics.samples, metrics: values, positions: metrics.positions)
        evaluationResult = report
        return [.emit(.phase(.reportingEvaluation))] + issue(.uploadEvaluation)
    }

    /// The evaluation task failed (cancellation included).
    mutating func evaluationFailed(_ error: OrchardClientError) -> [Action] {
        expect(.evaluating)
        return error.code == .cancelled ? fail(error) : dropEvaluation(error)
    }

    /// The coordinator stored the evaluation's result.
    mutating func evaluationAnswered(_ response: EvaluationReportResponse) -> [Action] {
        expect(.calling(.uploadEvaluation))
        guard let result = evaluationResult else { unexpected("an evaluation answer without a result") }
        let receipt = EvaluationReceipt(
            checkpoint: response.checkpoint, samples: result.samples, metrics: result.metrics, resultsReceived: response.resultsReceived)
        return [.emit(.evaluated(receipt)), .log(.info, "evaluation of checkpoint \(response.checkpoint) accepted")] + afterEvaluation(receipt)
    }

    /// Local training ended: with an update, or interrupted by cancellation with its state.
    mutating func trainingEnded(_ outcome: LocalTrainingOutcome) -> [Action] {
        expect(.training)
        guard let assignment, let session else { unexpected("training without an assignment") }
        switch outcome {
        case .interrupted(let state):
            let key = Self.checkpointKey(assignment)
            return [.saveCheckpoint(state, key), .log(.info, "training interrupted; checkpoint saved for cycle \(assignment.cycle)")]
                + fail(OrchardClientError(.cancelled, "the task was cancelled; training stopped at a batch boundary and its checkpoint was saved"))
        case .completed(let update):
            if let problem = Self.problem(with: update, shapes: shapes) {
                let diverged = update.diff.contains { !FloatScan.allFinite($0.values) }
                return fail(OrchardClientError(diverged ? .diverged : .training, problem))
            }
            if let secure = plan?.secureAggregation {
                let flat = SecureAggregationExchange.flatten(update.diff)
                if let failure = SecureAggregationExchange.validationFailure(plan: secure, update: flat, sampleCount: update.sampleCount) {
                    return fail(failure)
                }
                phase = .secureAggregating
                let input = SecureAggregationInput(
                    assignment: assignment, plan: secure, workerID: session.workerID, session: session.sessionToken, update: flat,
                    sampleCount: update.sampleCount,
                    waitLimit: setup.secureAggregationWait.seconds(
                        reportWithin: assignment.reportWithin, stageTimeout: secure.stageTimeout, laterStages: secure.parameters.consistencyCheck ? 4 : 3)
                )
                return [.emit(.phase(.secureAggregation)), .discardCheckpoint, .secureAggregate(input)]
            }
            let metadata = ReportMetadata(
                workerID: session.workerID, requestKey: assignment.requestKey, sampleCount: update.sampleCount, metrics: update.metrics,
                checkpoint: assignment.checkpoint)
            hasPendingReport = true
            return [.emit(.phase(.reporting)), .savePendingReport(ReportEnvelope.encode(diff: update.diff, metadata: metadata)), .discardCheckpoint]
                + issue(.uploadReport(fromEarlierWindow: false))
        }
    }

    /// Local training failed (cancellation included, after the caller's code saved what it wanted).
    mutating func trainingFailed(_ error: OrchardClientError) -> [Action] {
        expect(.training)
        return fail(error)
    }

    /// The secure-aggregation exchange ended: reported, or the device is out of the cycle (rejected).
    mutating func secureAggregationEnded(_ outcome: CycleOutcome) -> [Action] {
        expect(.secureAggregating)
        let line: String
        switch outcome {
        case .reported(let receipt): line = "secure aggregation: masked update sent for cycle \(receipt.cycle)"
        case .rejected(let retryAfter, let reason): line = "secure aggregation: out of the cycle (\(reason)); retry after \(retryAfter) s"
        case .conditionsNotMet(let unmet): line = "secure aggregation: conditions not met (\(unmet))"
        case .evaluated(let receipt): line = "secure aggregation: evaluated checkpoint \(receipt.checkpoint)"
        }
        return [.log(.info, line)] + finish(outcome)
    }

    /// The secure-aggregation exchange failed (cancellation included); the device's secrets are gone with it.
    mutating func secureAggregationFailed(_ error: OrchardClientError) -> [Action] {
        expect(.secureAggregating)
        return fail(error)
    }

    /// The backoff before a retry elapsed.
    mutating func backoffElapsed() -> [Action] {
        guard case .backingOff(let call) = phase else { unexpected("the end of a backoff") }
        return issue(call, fresh: false)
    }

    /// The last request failed with `error` (cancellation included).
    mutating func requestFailed(_ error: OrchardClientError) -> [Action] {
        let call: Call
        switch phase {
        case .calling(let current): call = current
        case .backingOff, .checkingConditions, .loading, .training, .secureAggregating, .evaluating: return fail(error)
        case .idle, .done: unexpected("a failure")
        }
        if error.code == .cancelled { return fail(error) }

        switch call {
        case .uploadReport(let fromEarlierWindow):
            if error.serverCode == .reportAlreadyReceived {
                // An earlier upload was committed but its answer was lost: the report already counts once.
                let actions: [Action] = [.clearPendingReport, .log(.info, "report had already been received")]
                guard !fromEarlierWindow, let assignment else { return actions + afterPendingReport() }
                return actions + finish(.reported(ReportReceipt(cycle: assignment.cycle, reportsReceived: nil, retryAfter: nil, fromEarlierWindow: false)))
            }
            if error.code == .serverError && !error.isTransient && error.isCoordinatorRefusal {
                let actions: [Action] = [.clearPendingReport, .log(.warning, "report discarded: the coordinator cannot accept it: \(error)")]
                return fromEarlierWindow ? actions + afterPendingReport() : actions + fail(error)
            }
        case .uploadEvaluation where error.serverCode == .evaluationAlreadyReceived:
            // An earlier attempt was stored but its answer was lost.
            guard let evaluation, let result = evaluationResult else { unexpected("an evaluation upload without a result") }
            let receipt = EvaluationReceipt(checkpoint: evaluation.checkpoint, samples: result.samples, metrics: result.metrics, resultsReceived: nil)
            return [.emit(.evaluated(receipt)), .log(.info, "evaluation result had already been received")] + afterEvaluation(receipt)
        case .downloadModel where error.serverCode == .unknownCheckpoint && evaluation == nil && !refreshedAssignment:
            // A buffered process published a newer checkpoint since the assignment: the same request gets it.
            refreshedAssignment = true
            return [.log(.info, "the assigned checkpoint was superseded; asking for the latest"), .discardPartialModel] + measureOrRequestCycle()
        case .downloadModel where error.serverCode == .rangeNotSatisfiable && !restartedAfterBadRange:
            restartedAfterBadRange = true
            return [.log(.info, "the coordinator cannot serve the rest of the partial model; downloading it from byte zero"), .discardPartialModel]
                + issue(.downloadModel)
        default:
            break
        }

        if error.code == .authenticationFailed && call != .authenticate && !renewedSession {
            callAfterAuthentication = call
            return [.log(.info, "session refused; authenticating again"), .clearSession] + issue(.authenticate)
        }
        if error.isTransient, let wait = error.retryAfter, wait > setup.retry.maximumDelay.inSeconds || attempt >= setup.retry.maximumAttempts {
            // The coordinator asked for a longer wait than a retry within this cycle may take: ask again later.
            let reason = error.serverCode?.rawValue ?? "http_\(error.httpStatus ?? 0)"
            return [.log(.info, "the coordinator asked to wait \(wait) s (\(reason)): \(error.message)")] + finish(.rejected(retryAfter: wait, reason: reason))
        }
        if error.isTransient && attempt < setup.retry.maximumAttempts {
            let retry = attempt
            attempt += 1
            phase = .backingOff(call)
            return [
                .log(.debug, "retry \(retry) after \(error)"), .emit(.retrying(attempt: retry, error: error)),
                .backoff(retry: retry, seconds: error.retryAfter),
            ]
        }
        // An evaluation task that cannot be done (closed, expired, refused) is left: the window goes on to training.
        if evaluation != nil && [.downloadPlan, .downloadModel, .uploadEvaluation].contains(call) { return dropEvaluation(error) }
        return fail(error)
    }

    // MARK: Steps

    private mutating func load() -> [Action] {
        phase = .loading
        return [.loadState]
    }

    /// With a session: the kept report first, otherwise the cycle request.
    private mutating func afterSession() -> [Action] {
        if hasPendingReport {
            return [.emit(.phase(.uploadingPendingReport))] + issue(.uploadReport(fromEarlierWindow: true))
        }
        return afterPendingReport()
    }

    private mutating func afterPendingReport() -> [Action] {
        hasPendingReport = false
        return measureOrRequestCycle()
    }

    /// Whether the process asks for link speeds and none were measured for this cycle yet.
    private var needsLinkSpeed: Bool { session?.requiresSpeedTest == true && linkSpeed == nil }

    /// The cycle request, after measuring the link when the process asks for link speeds.
    private mutating func measureOrRequestCycle() -> [Action] {
        if needsLinkSpeed { return [.emit(.phase(.measuringLinkSpeed))] + issue(.measureLinkSpeed) }
        return [.emit(.phase(.requestingCycle))] + issue(.requestCycle)
    }

    private mutating func beginTraining(_ weights: [TensorRecord]) -> [Action] {
        if let evaluation, let plan {
            phase = .evaluating
            let input = EvaluationInput(assignment: evaluation, plan: plan, model: CycleModel(spec: plan.model, weights: weights))
            return [.emit(.phase(.evaluating)), .evaluate(input)]
        }
        guard let assignment, let plan, let training else { unexpected("training without a plan") }
        phase = .training
        let input = TrainingInput(
            assignment: assignment, plan: plan, model: CycleModel(spec: plan.model, weights: weights), resumeState: resumeState,
            training: training, checkpointKey: Self.checkpointKey(assignment)
        )
        return [.emit(.phase(.training))] + (resumeState != nil ? [.emit(.resumedTraining)] : []) + [.train(input)]
    }

    /// Leaves the evaluation task after `error`, and goes on as after a result.
    private mutating func dropEvaluation(_ error: OrchardClientError) -> [Action] {
        [.log(.warning, "evaluation task left: \(error)")] + afterEvaluation(nil)
    }

    /// After an evaluation task: the cycle request again for training, when the window takes training; otherwise the end.
    private mutating func afterEvaluation(_ receipt: EvaluationReceipt?) -> [Action] {
        evaluation = nil
        evaluationResult = nil
        plan = nil
        shapes = [:]
        restartedAfterCorruption = false
        restartedAfterBadRange = false
        requestTasks.removeAll { $0 == .evaluation }
        if requestTasks.contains(.training) { return [.emit(.phase(.requestingCycle))] + issue(.requestCycle) }
        if let receipt { return finish(.evaluated(receipt)) }
        return finish(.rejected(retryAfter: Self.evaluationRetry, reason: "evaluation_left"))
    }

    /// Seconds an evaluation-only window that could not evaluate waits before asking again.
    static let evaluationRetry: Double = 60

    /// The request action of `call`. A fresh call starts its attempts from 1; `renewed` marks a call repeated
    /// with a renewed session (refused again, it fails).
    private mutating func issue(_ call: Call, fresh: Bool = true, renewed: Bool = false) -> [Action] {
        if fresh {
            attempt = 1
            renewedSession = renewed
        }
        phase = .calling(call)
        var actions: [Action] = []
        if call == .authenticate && fresh { actions.append(.emit(.phase(.authenticating))) }
        guard call == .authenticate || session != nil else { unexpected("a coordinator call without a session") }
        let token = session?.sessionToken ?? ""
        switch call {
        case .authenticate:
            actions.append(.authenticate(AuthenticateRequest(authToken: setup.authToken, processName: setup.processName, processVersion: setup.version)))
        case .uploadReport:
            actions.append(.uploadReport(session: token))
        case .measureLinkSpeed:
            actions.append(.measureLinkSpeed(session: token, downloadBytes: session?.speedTestDownloadBytes, uploadBytes: session?.speedTestUploadBytes))
        case .requestCycle:
            let request = CycleRequest(
                workerID: session?.workerID ?? "", processName: setup.processName, processVersion: setup.version,
                downloadMbps: linkSpeed?.downloadMbps, uploadMbps: linkSpeed?.uploadMbps,
                tasks: requestTasks.contains(.evaluation) ? requestTasks : nil
            )
            actions.append(.requestCycle(request, session: token))
        case .downloadPlan:
            if let evaluation {
                actions.append(.downloadPlan(planID: evaluation.planID, requestKey: evaluation.requestKey, session: token))
            } else {
                guard let assignment else { unexpected("a plan download without an assignment") }
                actions.append(.downloadPlan(planID: assignment.planID, requestKey: assignment.requestKey, session: token))
            }
        case .downloadModel:
            if let evaluation {
                actions.append(.downloadModel(modelID: evaluation.modelID, requestKey: evaluation.requestKey, session: token))
            } else {
                guard let assignment else { unexpected("a model download without an assignment") }
                actions.append(.downloadModel(modelID: assignment.modelID, requestKey: assignment.requestKey, session: token))
            }
        case .uploadEvaluation:
            guard let evaluationResult else { unexpected("an evaluation upload without a result") }
            actions.append(.uploadEvaluation(evaluationResult, session: token))
        }
        return actions
    }

    private mutating func finish(_ outcome: CycleOutcome) -> [Action] {
        phase = .done
        // The coordinator's waits are bounded here, before anything schedules by them.
        switch outcome {
        case .rejected(let retryAfter, let reason): return [.finish(.rejected(retryAfter: RetryAfter.bounded(retryAfter), reason: reason))]
        case .reported(var receipt):
            receipt.retryAfter = receipt.retryAfter.map(RetryAfter.bounded)
            return [.finish(.reported(receipt))]
        default: return [.finish(outcome)]
        }
    }

    private mutating func fail(_ error: OrchardClientError) -> [Action] {
        phase = .done
        return [.fail(error)]
    }

    private func expect(_ expected: Phase) {
        guard phase == expected else { unexpected("an event for \(expected)") }
    }

    private func unexpected(_ what: String) -> Never {
        preconditionFailure("job cycle state machine: \(what) arrived in phase \(phase)")
    }

    // MARK: Pure checks

    static func checkpointKey(_ assignment: CycleAssignment) -> ClientStore.CheckpointKey {
        ClientStore.CheckpointKey(requestKey: assignment.requestKey, modelID: assignment.modelID, cycle: assignment.cycle)
    }

    /// What is wrong with a caller's update, or nil when it can be written and sent.
    static func problem(with update: LocalUpdate, shapes: [String: [Int]]) -> String? {
        guard update.sampleCount >= 1 else { return "the update's sample count must be at least 1, not \(update.sampleCount)" }
        let names = Set(update.diff.map(\.name))
        guard names == Set(shapes.keys), names.count == update.diff.count else {
            return "the diff's tensors \(update.diff.map(\.name).sorted()) are not the model's \(shapes.keys.sorted())"
        }
        for tensor in update.diff {
            guard tensor.shape == shapes[tensor.name] else {
                return "diff tensor '\(tensor.name)' has shape \(tensor.shape), the model's is \(shapes[tensor.name] ?? [])"
            }
            guard FloatScan.allFinite(tensor.values) else { return "diff tensor '\(tensor.name)' holds NaN or infinity" }
        }
        // What the coordinator would refuse the whole report for: told to the app here, before anything is sent.
        if let failure = WireLimits.metricsFailure(update.metrics) { return "the update's metrics: \(failure)" }
        return nil
    }
}
