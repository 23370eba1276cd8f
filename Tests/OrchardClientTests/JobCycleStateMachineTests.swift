import Foundation
@testable import OrchardClient
import OrchardFormats
import OrchardML
import OrchardProtocol
import OrchardScheduler
import Testing

/// The job cycle as a pure state machine: every transition, without files, sockets or clocks.
@Suite("Job cycle state machine")
struct JobCycleStateMachineTests {
    typealias Machine = JobCycleStateMachine
    typealias Action = JobCycleStateMachine.Action

    static let server = "https://fl.example.com"
    static let now: Double = 1_000_000
    static let config = ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 3)

    static func machine(maximumAttempts: Int = 3, rules: ConditionRules = ConditionRules()) -> Machine {
        Machine(
            setup: Machine.Setup(
                server: server, authToken: "jwt", processName: "regressor", version: SemanticVersion(1, 0),
                retry: RequestRetryPolicy(maximumAttempts: maximumAttempts), conditionRules: rules, trainingSeed: 42
            ))
    }

    static func session(expiresAt: Double = now + 3600, server: String = server, requiresSpeedTest: Bool? = false) -> ClientStore.Identity {
        ClientStore.Identity(workerID: "w1", sessionToken: "t1", expiresAt: expiresAt, server: server, requiresSpeedTest: requiresSpeedTest)
    }

    static func assignment(key: String = "k1", cycle: Int = 3, modelID: String = "p.2") -> CycleAssignment {
        CycleAssignment(requestKey: key, processID: "p", cycle: cycle, checkpoint: 2, modelID: modelID, planID: "p", reportWithin: 600)
    }

    static var plan: TrainingPlan { TrainingPlan(planID: "p", model: Fixture.spec, clientConfig: config) }
    static func shapes() throws -> [String: [Int]] { try EngineLocalTrainer().parameterShapes(of: Fixture.spec) }

    static func info(for bytes: [UInt8], sha256: [UInt8]? = nil) -> ClientStore.ModelInfo {
        ClientStore.ModelInfo(modelID: "p.2", etag: "\"p.2\"", totalLength: bytes.count, sha256: Data(sha256 ?? ModelIntegrity.sha256(bytes)))
    }

    static func stored(session: ClientStore.Identity? = session(), pending: Bool = false, checkpoint: (key: ClientStore.CheckpointKey, state: [UInt8])? = nil)
        -> Machine.Stored
    {
        Machine.Stored(session: session, hasPendingReport: pending, checkpoint: checkpoint)
    }

    /// A compact name per action, for comparing sequences; log lines are left out.
    static func names(_ actions: [Action]) -> [String] {
        actions.compactMap { action in
            switch action {
            case .emit(.phase(let phase)): "phase:\(phase)"
            case .emit(.retrying(let attempt, _)): "retrying:\(attempt)"
            case .emit(.resumedTraining): "resumedTraining"
            case .emit(.evaluated): "evaluated"
            case .emit(.downloaded): "downloaded"
            case .emit: "emit"
            case .log: nil
            case .saveSession: "saveSession"
            case .clearSession: "clearSession"
            case .savePendingReport: "savePendingReport"
            case .clearPendingReport: "clearPendingReport"
            case .saveCheckpoint: "saveCheckpoint"
            case .discardCheckpoint: "discardCheckpoint"
            case .discardPartialModel: "discardPartialModel"
            case .keepModel: "keepModel"
            case .readConditions: "readConditions"
            case .loadState: "loadState"
            case .authenticate: "authenticate"
            case .uploadReport: "uploadReport"
            case .measureLinkSpeed: "measureLinkSpeed"
            case .requestCycle: "requestCycle"
            case .downloadPlan: "downloadPlan"
            case .loadCachedModel: "loadCachedModel"
            case .downloadModel: "downloadModel"
            case .backoff(let retry, let seconds): seconds.map { "backoff:\(retry):\($0)s" } ?? "backoff:\(retry)"
            case .train: "train"
            case .secureAggregate: "secureAggregate"
            case .evaluate: "evaluate"
            case .uploadEvaluation: "uploadEvaluation"
            case .finish: "finish"
            case .fail(let error): "fail:\(error.code)"
            }
        }
    }

    static func outcome(_ actions: [Action]) -> CycleOutcome? {
        if case .finish(let outcome) = actions.last { return outcome }
        return nil
    }

    static func failure(_ actions: [Action]) -> OrchardClientError? {
        if case .fail(let error) = actions.last { return error }
        return nil
    }

    static func trainingInput(_ actions: [Action]) -> Machine.TrainingInput? {
        if case .train(let input) = actions.last { return input }
        return nil
    }

    /// Drives a machine with a saved session up to the model step: assignment accepted, plan downloaded.
    static func toModel(_ machine: inout Machine, stored: Machine.Stored = stored(), assignment: CycleAssignment = assignment()) throws {
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(stored, now: now)
        _ = machine.cycleAnswered(.accepted(assignment))
        _ = machine.planDownloaded(plan, shapes: try shapes())
    }

    /// Drives a machine with a saved session up to its training step.
    static func toTraining(_ machine: inout Machine, stored: Machine.Stored = stored(), assignment: CycleAssignment = assignment()) throws -> [Action] {
        try toModel(&machine, stored: stored, assignment: assignment)
        _ = machine.cachedModelLoaded(nil, info: nil)
        let bytes = try Fixture.initialWeights()
        return machine.modelDownloaded(bytes, info: info(for: bytes))
    }

    static func update(scale: Float = 0.01) throws -> LocalUpdate {
        let diff = try shapes().sorted { $0.key < $1.key }.map { name, shape in
            TensorRecord(name: name, shape: shape, values: [Float](repeating: scale, count: shape.reduce(1, *)))
        }
        return LocalUpdate(diff: diff, sampleCount: 96, metrics: ["loss": 0.5])
    }

    // MARK: The whole cycle

    @Test("a first cycle: authenticate, request, plan, model, train, keep the report on disk, upload it, finish")
    func fullCycle() throws {
        var machine = Self.machine()
        #expect(Self.names(machine.start(constraints: .none)) == ["loadState"])
        #expect(Self.names(machine.stateLoaded(Self.stored(session: nil), now: Self.now)) == ["phase:authenticating", "authenticate"])
        let response = AuthenticateResponse(workerID: "w9", sessionToken: "t9", expiresIn: 3600, requiresSpeedTest: false)
        let afterAuth = machine.authenticated(response, now: Self.now)
        #expect(Self.names(afterAuth) == ["saveSession", "phase:requestingCycle", "requestCycle"])
        if case .saveSession(let identity) = afterAuth.first {
            #expect(
                identity == ClientStore.Identity(workerID: "w9", sessionToken: "t9", expiresAt: Self.now + 3600, server: Self.server, requiresSpeedTest: false))
        }
        if case .requestCycle(let request, let token) = afterAuth.last {
            #expect(request.workerID == "w9" && request.processName == "regressor" && token == "t9")
        }
        #expect(Self.names(machine.cycleAnswered(.accepted(Self.assignment()))) == ["phase:downloadingPlan", "downloadPlan"])
        #expect(Self.names(machine.planDownloaded(Self.plan, shapes: try Self.shapes())) == ["phase:downloadingModel", "loadCachedModel"])
        #expect(Self.names(machine.cachedModelLoaded(nil, info: nil)) == ["downloadModel"])
        let bytes = try Fixture.initialWeights()
        let trained = machine.modelDownloaded(bytes, info: Self.info(for: bytes))
        #expect(Self.names(trained) == ["keepModel", "phase:training", "train"])
        let input = try #require(Self.trainingInput(trained))
        #expect(input.training.seed == 42 + 3)
        // The plan's client config over the architecture's training section, resolved once by the machine.
        #expect(input.training == (try TrainingConfiguration.resolved(architecture: Fixture.spec, clientConfig: Self.config, seed: 45)))
        #expect(input.resumeState == nil)
        #expect(input.checkpointKey == ClientStore.CheckpointKey(requestKey: "k1", modelID: "p.2", cycle: 3))
        #expect(input.model.weights.map(\.name).sorted() == (try Self.shapes()).keys.sorted())

        let reporting = machine.trainingEnded(.completed(try Self.update()))
        #expect(Self.names(reporting) == ["phase:reporting", "savePendingReport", "discardCheckpoint", "uploadReport"])
        if case .savePendingReport(let body) = reporting[1] {
            let metadata = try ReportEnvelope.metadata(of: Safetensors.decode(body))
            #expect(metadata.requestKey == "k1" && metadata.workerID == "w9" && metadata.sampleCount == 96)
        }
        let finished = machine.reportAnswered(ReportResponse(cycle: 3, reportsReceived: 4, retryAfter: 60))
        #expect(Self.names(finished) == ["clearPendingReport", "finish"])
        #expect(Self.outcome(finished) == .reported(ReportReceipt(cycle: 3, reportsReceived: 4, retryAfter: 60, fromEarlierWindow: false)))
    }

    @Test("unmet conditions end the cycle before any state is read; met conditions go on")
    func conditions() {
        let constraints = TaskConstraints(requiresExternalPower: true, requiresNetworkConnectivity: true)
        var unplugged = Self.machine()
        #expect(Self.names(unplugged.start(constraints: constraints)) == ["phase:checkingConditions", "readConditions"])
        let battery = DeviceConditions(onExternalPower: false, hasBattery: true, batteryLevel: 0.5, batteryCharging: false, networkConnected: true)
        let ended = unplugged.conditionsRead(battery)
        #expect(Self.names(ended) == ["finish"])
        guard case .conditionsNotMet(let unmet)? = Self.outcome(ended) else {
            Issue.record("expected unmet conditions, got \(ended)")
            return
        }
        #expect(unmet.count == 1)

        var plugged = Self.machine()
        _ = plugged.start(constraints: constraints)
        let full = DeviceConditions(onExternalPower: true, hasBattery: true, batteryLevel: 1, batteryCharging: true, networkConnected: true)
        #expect(Self.names(plugged.conditionsRead(full)) == ["loadState"])
    }

    @Test(
        "a saved session is reused only for the same server while it has time left",
        arguments: [
            (Self.session(), false), (Self.session(expiresAt: Self.now + 30), true), (Self.session(server: "http://other"), true),
        ])
    func sessionReuse(saved: ClientStore.Identity, authenticates: Bool) {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        let actions = machine.stateLoaded(Self.stored(session: saved), now: Self.now)
        #expect(Self.names(actions) == (authenticates ? ["phase:authenticating", "authenticate"] : ["phase:requestingCycle", "requestCycle"]))
    }

    @Test("a rejection finishes with the server's retry-after and reason")
    func rejection() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(), now: Self.now)
        let actions = machine.cycleAnswered(.rejected(CycleRejection(retryAfter: 123.5, reason: "cycle_full")))
        #expect(Self.names(actions) == ["finish"])
        #expect(Self.outcome(actions) == .rejected(retryAfter: 123.5, reason: "cycle_full"))
    }

    // MARK: Authentication

    @Test("a refused credential fails at once, without retries")
    func authenticationFailure() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(session: nil), now: Self.now)
        let actions = machine.requestFailed(.server(status: 401, body: ErrorBody(code: .unauthorized, message: "bad token")))
        #expect(Self.names(actions) == ["fail:authentication_failed"])
    }

    @Test("a refused session is renewed once and the call repeated; refused again, the cycle fails")
    func sessionRenewal() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(), now: Self.now)
        let refused = OrchardClientError.server(status: 401, body: ErrorBody(code: .unauthorized, message: "session expired"))
        #expect(Self.names(machine.requestFailed(refused)) == ["clearSession", "phase:authenticating", "authenticate"])
        let renewed = machine.authenticated(AuthenticateResponse(workerID: "w1", sessionToken: "t2", expiresIn: 3600, requiresSpeedTest: false), now: Self.now)
        #expect(Self.names(renewed) == ["saveSession", "requestCycle"])
        if case .requestCycle(_, let token) = renewed.last { #expect(token == "t2") }
        #expect(Self.names(machine.requestFailed(refused)) == ["fail:authentication_failed"])
    }

    // MARK: Link speed

    @Test("a process that asks for link speeds gets them measured before the cycle request, and sent in it")
    func linkSpeedBeforeCycleRequest() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(session: nil), now: Self.now)
        let response = AuthenticateResponse(workerID: "w9", sessionToken: "t9", expiresIn: 3600, requiresSpeedTest: true)
        let afterAuth = machine.authenticated(response, now: Self.now)
        #expect(Self.names(afterAuth) == ["saveSession", "phase:measuringLinkSpeed", "measureLinkSpeed"])
        if case .saveSession(let identity) = afterAuth.first { #expect(identity.requiresSpeedTest == true) }
        let measured = machine.linkSpeedMeasured(LinkSpeed(downloadMbps: 12.5, uploadMbps: 3))
        #expect(Self.names(measured) == ["phase:requestingCycle", "requestCycle"])
        guard case .requestCycle(let request, _) = measured.last else {
            Issue.record("expected a cycle request, got \(Self.names(measured))")
            return
        }
        #expect(request.downloadMbps == 12.5)
        #expect(request.uploadMbps == 3)
    }

    @Test("a saved session remembers the process wants link speeds; one saved before the client knew is not reused")
    func linkSpeedWithSavedSession() {
        var gated = Self.machine(maximumAttempts: 2)
        _ = gated.start(constraints: .none)
        #expect(
            Self.names(gated.stateLoaded(Self.stored(session: Self.session(requiresSpeedTest: true)), now: Self.now)) == [
                "phase:measuringLinkSpeed", "measureLinkSpeed",
            ])
        // A failed measurement is retried like any call, then fails the cycle.
        let broken = OrchardClientError(.network, "connection reset")
        #expect(Self.names(gated.requestFailed(broken)) == ["retrying:1", "backoff:1"])
        #expect(Self.names(gated.backoffElapsed()) == ["measureLinkSpeed"])
        #expect(Self.names(gated.requestFailed(broken)) == ["fail:network"])

        var open = Self.machine()
        _ = open.start(constraints: .none)
        #expect(Self.names(open.stateLoaded(Self.stored(), now: Self.now)) == ["phase:requestingCycle", "requestCycle"])

        var old = Self.machine()
        _ = old.start(constraints: .none)
        #expect(
            Self.names(old.stateLoaded(Self.stored(session: Self.session(requiresSpeedTest: nil)), now: Self.now)) == ["phase:authenticating", "authenticate"])
    }

    @Test("a session renewed after a refused cycle request measures the link first when the process now asks for it")
    func linkSpeedAfterRenewal() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(), now: Self.now)
        let refused = OrchardClientError.server(status: 401, body: ErrorBody(code: .unauthorized, message: "session expired"))
        #expect(Self.names(machine.requestFailed(refused)) == ["clearSession", "phase:authenticating", "authenticate"])
        let renewed = machine.authenticated(AuthenticateResponse(workerID: "w1", sessionToken: "t2", expiresIn: 3600, requiresSpeedTest: true), now: Self.now)
        #expect(Self.names(renewed) == ["saveSession", "phase:measuringLinkSpeed", "measureLinkSpeed"])
        #expect(Self.names(machine.linkSpeedMeasured(LinkSpeed(downloadMbps: 1, uploadMbps: 1))) == ["phase:requestingCycle", "requestCycle"])
        // Refused again with the renewed session: the cycle fails instead of renewing forever.
        #expect(Self.names(machine.requestFailed(refused)) == ["fail:authentication_failed"])
    }

    @Test("a coordinator speaking another protocol major version is refused")
    func protocolMismatch() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(session: nil), now: Self.now)
        var response = AuthenticateResponse(workerID: "w1", sessionToken: "t1", expiresIn: 3600, requiresSpeedTest: false)
        response.protocolVersion = SemanticVersion(WireProtocol.version.major + 1, 0)
        #expect(Self.names(machine.authenticated(response, now: Self.now)) == ["fail:incompatible_model"])
    }

    // MARK: The report kept from an earlier window

    @Test("a kept report is uploaded before anything else and ends the window once accepted")
    func pendingReportFirst() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        let first = machine.stateLoaded(Self.stored(pending: true), now: Self.now)
        #expect(Self.names(first) == ["phase:uploadingPendingReport", "uploadReport"])
        let done = machine.reportAnswered(ReportResponse(cycle: 2, reportsReceived: 5, retryAfter: 30))
        #expect(Self.names(done) == ["clearPendingReport", "finish"])
        #expect(Self.outcome(done) == .reported(ReportReceipt(cycle: 2, reportsReceived: 5, retryAfter: 30, fromEarlierWindow: true)))
    }

    @Test("a kept report the coordinator already counted is deleted, not uploaded again, and the window goes on")
    func pendingReportAlreadyReceived() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(pending: true), now: Self.now)
        let duplicate = OrchardClientError.server(status: 409, body: ErrorBody(code: .reportAlreadyReceived, message: "already"))
        #expect(Self.names(machine.requestFailed(duplicate)) == ["clearPendingReport", "phase:requestingCycle", "requestCycle"])
    }

    @Test("a kept report that fails transiently is retried with backoff, then kept on disk for the next window")
    func pendingReportKeptOnFailure() {
        var machine = Self.machine(maximumAttempts: 2)
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(pending: true), now: Self.now)
        let lost = OrchardClientError(.network, "connection reset")
        #expect(Self.names(machine.requestFailed(lost)) == ["retrying:1", "backoff:1"])
        #expect(Self.names(machine.backoffElapsed()) == ["uploadReport"])
        let last = machine.requestFailed(lost)
        #expect(Self.names(last) == ["fail:network"])
    }

    @Test("this window's report answered 'already received' counts as reported to its cycle")
    func reportAlreadyReceived() throws {
        var machine = Self.machine()
        _ = try Self.toTraining(&machine)
        _ = machine.trainingEnded(.completed(try Self.update()))
        let actions = machine.requestFailed(.server(status: 409, body: ErrorBody(code: .reportAlreadyReceived, message: "already")))
        #expect(Self.names(actions) == ["clearPendingReport", "finish"])
        #expect(Self.outcome(actions) == .reported(ReportReceipt(cycle: 3, reportsReceived: nil, retryAfter: nil, fromEarlierWindow: false)))
    }

    // MARK: Checkpoints and cancellation

    @Test("a checkpoint of the same assignment is resumed; of another cycle it is discarded")
    func checkpointMatching() throws {
        let state: [UInt8] = [1, 2, 3]
        let same = ClientStore.CheckpointKey(requestKey: "k1", modelID: "p.2", cycle: 3)
        var resuming = Self.machine()
        let resumed = try Self.toTraining(&resuming, stored: Self.stored(checkpoint: (same, state)))
        #expect(Self.names(resumed) == ["keepModel", "phase:training", "resumedTraining", "train"])
        #expect(Self.trainingInput(resumed)?.resumeState == state)

        let old = ClientStore.CheckpointKey(requestKey: "k0", modelID: "p.1", cycle: 2)
        var changed = Self.machine()
        _ = changed.start(constraints: .none)
        _ = changed.stateLoaded(Self.stored(checkpoint: (old, state)), now: Self.now)
        #expect(Self.names(changed.cycleAnswered(.accepted(Self.assignment()))) == ["discardCheckpoint", "phase:downloadingPlan", "downloadPlan"])
        _ = changed.planDownloaded(Self.plan, shapes: try Self.shapes())
        _ = changed.cachedModelLoaded(nil, info: nil)
        let bytes = try Fixture.initialWeights()
        let fresh = changed.modelDownloaded(bytes, info: Self.info(for: bytes))
        #expect(Self.names(fresh) == ["keepModel", "phase:training", "train"])
        #expect(Self.trainingInput(fresh)?.resumeState == nil)
    }

    @Test("cancellation mid-training saves the checkpoint under the assignment's key, then fails as cancelled")
    func cancellationSavesCheckpoint() throws {
        var machine = Self.machine()
        _ = try Self.toTraining(&machine)
        let actions = machine.trainingEnded(.interrupted(checkpoint: [9, 9]))
        #expect(Self.names(actions) == ["saveCheckpoint", "fail:cancelled"])
        guard case .saveCheckpoint(let state, let key) = actions.first else { return }
        #expect(state == [9, 9])
        #expect(key == ClientStore.CheckpointKey(requestKey: "k1", modelID: "p.2", cycle: 3))
    }

    @Test("a cancelled call fails as cancelled without a retry")
    func cancelledCall() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(), now: Self.now)
        #expect(Self.names(machine.requestFailed(OrchardClientError(.cancelled, "the task was cancelled"))) == ["fail:cancelled"])
    }

    @Test("an update that does not fit the model is refused before it is written")
    func invalidUpdate() throws {
        var machine = Self.machine()
        _ = try Self.toTraining(&machine)
        var update = try Self.update()
        update.diff[0].values[0] = .nan
        // Non-finite values: local training diverged.
        #expect(Self.names(machine.trainingEnded(.completed(update))) == ["fail:diverged"])
        var wrongShape = Self.machine()
        _ = try Self.toTraining(&wrongShape)
        var misshapen = try Self.update()
        misshapen.diff[0].shape = [misshapen.diff[0].values.count, 1, 1]
        #expect(Self.names(wrongShape.trainingEnded(.completed(misshapen))) == ["fail:training"])
        // Metrics the coordinator would refuse the whole report for (17 names, a bidi override): told to the app now.
        for metrics in [Dictionary(uniqueKeysWithValues: (0..<17).map { ("m\($0)", 1.0) }), ["lo\u{202E}ss": 1.0]] {
            var crowded = Self.machine()
            _ = try Self.toTraining(&crowded)
            var update = try Self.update()
            update.metrics = metrics
            #expect(Self.names(crowded.trainingEnded(.completed(update))) == ["fail:training"])
        }
    }

    // MARK: Downloads

    @Test("a model failing its integrity check is downloaded again from byte zero once, then the cycle fails")
    func integrityFailure() throws {
        var machine = Self.machine()
        try Self.toModel(&machine)
        _ = machine.cachedModelLoaded(nil, info: nil)
        let good = try Fixture.initialWeights()
        var corrupt = good
        corrupt[corrupt.count - 3] ^= 0xFF
        let expected = Self.info(for: good)
        #expect(Self.names(machine.modelDownloaded(corrupt, info: expected)) == ["discardPartialModel", "downloadModel"])
        let second = machine.modelDownloaded(corrupt, info: expected)
        #expect(Self.names(second) == ["discardPartialModel", "fail:incompatible_model"])
        #expect(Self.failure(second)?.message.contains("SHA-256") == true)
    }

    @Test("a model without a digest cannot be verified and is refused")
    func missingDigest() throws {
        var machine = Self.machine()
        let bytes = try Fixture.initialWeights()
        try Self.toModel(&machine)
        _ = machine.cachedModelLoaded(nil, info: nil)
        var info = Self.info(for: bytes)
        info.sha256 = nil
        #expect(Self.names(machine.modelDownloaded(bytes, info: info)) == ["discardPartialModel", "downloadModel"])
        #expect(Self.names(machine.modelDownloaded(bytes, info: info)) == ["discardPartialModel", "fail:incompatible_model"])
    }

    @Test("a verified kept model skips the download; a kept model with the wrong digest is downloaded again")
    func cachedModel() throws {
        let bytes = try Fixture.initialWeights()
        for (digest, downloads) in [(ModelIntegrity.sha256(bytes), false), ([UInt8](repeating: 0, count: 32), true)] {
            var machine = Self.machine()
            try Self.toModel(&machine)
            let actions = machine.cachedModelLoaded(bytes, info: Self.info(for: bytes, sha256: digest))
            #expect(Self.names(actions) == (downloads ? ["downloadModel"] : ["downloaded", "phase:training", "train"]))
        }
    }

    @Test("a range the server cannot serve restarts the download from byte zero once")
    func rangeNotSatisfiable() throws {
        var machine = Self.machine()
        try Self.toModel(&machine)
        _ = machine.cachedModelLoaded(nil, info: nil)
        let unsatisfiable = OrchardClientError(.serverError, "range", httpStatus: 416, serverCode: .rangeNotSatisfiable)
        #expect(Self.names(machine.requestFailed(unsatisfiable)) == ["discardPartialModel", "downloadModel"])
        #expect(Self.names(machine.requestFailed(unsatisfiable)) == ["fail:server_error"])
    }

    @Test("a plan whose client configuration is invalid is an incompatible model")
    func invalidPlan() throws {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(), now: Self.now)
        _ = machine.cycleAnswered(.accepted(Self.assignment()))
        var plan = Self.plan
        plan.clientConfig.batchSize = 0
        #expect(Self.names(machine.planDownloaded(plan, shapes: try Self.shapes())) == ["fail:incompatible_model"])
    }

    // MARK: Retries

    @Test(
        "transient failures back off with increasing retry numbers, then fail; other failures fail at once",
        arguments: [
            (OrchardClientError(.network, "reset"), true),
            (OrchardClientError.server(status: 503, body: nil), true),
            (OrchardClientError.server(status: 400, body: ErrorBody(code: .invalidRequest, message: "bad")), false),
        ])
    func retries(error: OrchardClientError, transient: Bool) {
        var machine = Self.machine(maximumAttempts: 3)
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(), now: Self.now)
        guard transient else {
            #expect(Self.names(machine.requestFailed(error)) == ["fail:\(error.code)"])
            return
        }
        #expect(Self.names(machine.requestFailed(error)) == ["retrying:1", "backoff:1"])
        #expect(Self.names(machine.backoffElapsed()) == ["requestCycle"])
        #expect(Self.names(machine.requestFailed(error)) == ["retrying:2", "backoff:2"])
        #expect(Self.names(machine.backoffElapsed()) == ["requestCycle"])
        #expect(Self.names(machine.requestFailed(error)) == ["fail:\(error.code)"])
    }

    @Test(
        "a 429 or 503 with Retry-After waits exactly that long; a wait longer than the policy's cap, or after the last attempt, ends the cycle as rejected with it"
    )
    func retryAfterIsTheBackoff() {
        let limited = OrchardClientError.server(status: 429, body: ErrorBody(code: .rateLimited, message: "slow down"), retryAfter: 7)
        var machine = Self.machine(maximumAttempts: 2)
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(), now: Self.now)
        #expect(Self.names(machine.requestFailed(limited)) == ["retrying:1", "backoff:1:7.0s"])
        #expect(Self.names(machine.backoffElapsed()) == ["requestCycle"])
        let last = machine.requestFailed(limited)
        #expect(Self.outcome(last) == .rejected(retryAfter: 7, reason: "rate_limited"))

        var patient = Self.machine(maximumAttempts: 5)
        _ = patient.start(constraints: .none)
        _ = patient.stateLoaded(Self.stored(), now: Self.now)
        let busy = OrchardClientError.server(status: 503, body: nil, retryAfter: 3600)
        #expect(Self.outcome(patient.requestFailed(busy)) == .rejected(retryAfter: 3600, reason: "internal_error"))

        // Without Retry-After, the policy's backoff applies as before; a 429 is transient, a 400 is not.
        var plain = Self.machine(maximumAttempts: 3)
        _ = plain.start(constraints: .none)
        _ = plain.stateLoaded(Self.stored(), now: Self.now)
        #expect(Self.names(plain.requestFailed(OrchardClientError.server(status: 429, body: nil))) == ["retrying:1", "backoff:1"])
    }

    @Test("the link is measured with the sizes the coordinator announced, and the session's token")
    func measuresAnnouncedSizes() {
        var machine = Self.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(session: nil), now: Self.now)
        let response = AuthenticateResponse(
            workerID: "w2", sessionToken: "t2", expiresIn: 3600, requiresSpeedTest: true, speedTestDownloadBytes: 5000, speedTestUploadBytes: 700)
        let actions = machine.authenticated(response, now: Self.now)
        guard case .measureLinkSpeed(let session, let down, let up) = actions.last else {
            Issue.record("expected a measurement, got \(Self.names(actions))")
            return
        }
        #expect(session == "t2" && down == 5000 && up == 700)
    }

    @Test("each call gets its own attempts: a retried call that succeeds leaves the next call the full count")
    func attemptsPerCall() {
        var machine = Self.machine(maximumAttempts: 2)
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Self.stored(), now: Self.now)
        let lost = OrchardClientError(.network, "reset")
        _ = machine.requestFailed(lost)
        _ = machine.backoffElapsed()
        _ = machine.cycleAnswered(.accepted(Self.assignment()))
        #expect(Self.names(machine.requestFailed(lost)) == ["retrying:1", "backoff:1"])
    }
}
