import OrchardSupport
import CoreMetrics
import Foundation
import OrchardCoreML
import Logging
import OrchardFormats
import OrchardPrivacy
public import OrchardProtocol
import Synchronization

// The device API: authentication, cycle requests, plan and model downloads.
extension Coordinator {
    // MARK: Device API

    /// Authenticates a device for a process and issues its session token; `address` is where the call came from (nil
    /// in process), which open-mode processes limit per ``CoordinatorConfiguration/openAuthenticationRate``.
    public func authenticate(_ request: AuthenticateRequest, from address: ClientAddress? = nil) async throws(CoordinatorError) -> AuthenticateResponse {
        guard WireProtocol.isCompatible(request.protocolVersion) else {
            throw CoordinatorError(.unsupportedVersion, "protocol version \(request.protocolVersion) is not compatible with \(WireProtocol.version)")
        }
        if let failure = WireLimits.nameFailure(request.processName, field: "process_name") {
            throw CoordinatorError(.invalidRequest, failure)
        }
        // Over a shared store the process is confirmed there (it may have been deleted through another instance): a
        // session is issued once per device and window, so one read is cheap.
        var known = try await knownProcessID(name: request.processName, version: request.processVersion)
        if let id = known, await !confirmShared(processID: id) {
            // Deleted through another instance: the name may be hosted again there (the reload took that one up).
            known = try await knownProcessID(name: request.processName, version: request.processVersion)
            if let again = known, await !confirmShared(processID: again) { known = nil }
        }
        guard let processID = known, let runtime = runtimes[processID] else {
            throw CoordinatorError(.unknownProcess, "no process '\(request.processName)' version \(request.processVersion)")
        }
        if [.local, .distributed].contains(runtime.process.serverConfig.privacy?.mode) && request.protocolVersion < WireProtocol.localPrivacyVersion {
            // An older device would ignore the plan's local_privacy and send its update without noise.
            throw CoordinatorError(
                .unsupportedVersion,
                "process '\(request.processName)' uses local differential privacy, which needs protocol \(WireProtocol.localPrivacyVersion) or later; this device speaks \(request.protocolVersion)"
            )
        }
        if runtime.process.serverConfig.secureAggregation != nil && request.protocolVersion < WireProtocol.secureAggregationVersion {
            // An older device would upload its update in the clear.
            throw CoordinatorError(
                .unsupportedVersion,
                "process '\(request.processName)' uses secure aggregation, which needs protocol \(WireProtocol.secureAggregationVersion) or later; this device speaks \(request.protocolVersion)"
            )
        }
        if runtime.process.serverConfig.bufferedAggregation != nil && request.protocolVersion < WireProtocol.bufferedAggregationVersion {
            // An older device would not say which checkpoint it trained from, which a buffered report is weighed by.
            throw CoordinatorError(
                .unsupportedVersion,
                "process '\(request.processName)' aggregates buffered (asynchronously), which needs protocol \(WireProtocol.bufferedAggregationVersion) or later; this device speaks \(request.protocolVersion)"
            )
        }
        if runtime.process.serverConfig.secureAggregation?.parameters.consistencyCheck == true
            && request.protocolVersion < WireProtocol.signedSecureAggregationVersion
        {
            throw CoordinatorError(
                .unsupportedVersion,
                "process '\(request.processName)' signs its secure aggregation (consistency_check), which needs protocol \(WireProtocol.signedSecureAggregationVersion) or later; this device speaks \(request.protocolVersion)"
            )
        }
        let now = clock.date
        let identity = try await runtime.authenticator.identity(of: request.authToken, now: now)
        let isOpen = runtime.process.serverConfig.authentication.mode == .open
        if isOpen {
            // Every open-mode call registers a worker: limited per client address, and capped per process.
            if let address, let wait = authenticationLimiter?.take(address, at: now) {
                metrics.authenticationsLimited.increment()
                throw .rateLimited("too many authentications from \(address) to open-mode processes", retryAfter: wait)
            }
            if let cap = configuration.maximumOpenWorkers, runtime.openWorkers >= cap {
                throw CoordinatorError(
                    .workerLimitReached,
                    "process '\(runtime.process.name)' version \(runtime.process.version) uses open authentication and already has its limit of \(cap) workers"
                )
            }
            // Reserved before the store call, so concurrent calls cannot pass the cap together.
            runtime.openWorkers += 1
        }
        let workerID: String
        do {
            // A device identity is scoped to the process and the issuer that vouched for it: the same `sub` in
            // another process, or from another issuer, is another worker.
            if let identity, let existing = try await store.workerID(processID: processID, issuer: identity.issuer, subject: identity.subject) {
                workerID = existing
            } else {
                let id = "w_" + randomHex(12)
                try await store.registerWorker(id: id, processID: processID, issuer: identity?.issuer, subject: identity?.subject, at: now)
                if let identity {
                    // Concurrent first authentications of one identity both get here; the store keeps the first
                    // registration and ignores the others, so every caller reads back the same worker.
                    guard let registered = try await store.workerID(processID: processID, issuer: identity.issuer, subject: identity.subject) else {
                        throw StoreError(.notFound, "worker for '\(identity.subject)' was registered but cannot be read back")
                    }
                    workerID = registered
                } else {
                    workerID = id
                }
            }
        } catch {
            if isOpen { runtime.openWorkers -= 1 }
            throw storeFailure(error, "register the worker")
        }
        knownWorkers.insert(workerID)
        guard let sessions = sessionIssuer.withLock({ $0 }) else { throw .internalError("coordinator not started") }
        let session = DeviceSession(workerID: workerID, processID: processID, processName: runtime.process.name, processVersion: runtime.process.version)
        let token = try await sessions.issue(session, expires: now.addingTimeInterval(configuration.sessionLifetime.inSeconds))
        let server = runtime.process.serverConfig
        return AuthenticateResponse(
            workerID: workerID, sessionToken: token, expiresIn: configuration.sessionLifetime.inSeconds, requiresSpeedTest: server.requiresSpeedTest,
            speedTestDownloadBytes: server.requiresSpeedTest ? server.speedTestDownloadBytes : nil,
            speedTestUploadBytes: server.requiresSpeedTest ? server.speedTestUploadBytes : nil
        )
    }

    /// Admits one speed-test transfer of a session and returns the most bytes it may move: the session's process must
    /// gate cycles on link speed, `requested` bytes (when known) must not exceed its size for `direction`, and the
    /// worker may run one test per direction per ``CoordinatorConfiguration/speedTestInterval``.
    /// - Throws: `forbidden` for a process without a speed test, `invalid_request` (download) or `payload_too_large`
    ///   (upload) for more bytes than the process asks for, `rate_limited` with a wait when the worker tested too recently.
    public func admitSpeedTest(_ direction: SpeedTestLeg, requested: Int?, session: DeviceSession) async throws(CoordinatorError) -> Int {
        // Over a shared store: a process deleted through another instance is noticed here (a one-row read).
        if store.isShared && runtimes[session.processID] != nil { await catchUpShared(processID: session.processID) }
        guard let runtime = try await knownRuntime(processID: session.processID) else {
            throw CoordinatorError(.unknownProcess, "the session's \(session.processDescription) is no longer hosted")
        }
        let server = runtime.process.serverConfig
        guard server.requiresSpeedTest else {
            throw CoordinatorError(.forbidden, "\(session.processDescription) does not gate cycles on link speed, so it runs no speed test")
        }
        let allowed = direction == .download ? server.speedTestDownloadBytes : server.speedTestUploadBytes
        if let requested, direction == .upload, requested > allowed {
            throw CoordinatorError(.payloadTooLarge, "the speed-test upload of \(requested) bytes exceeds the \(allowed) bytes this process asks for")
        }
        if let requested, direction == .download, !(1...allowed).contains(requested) {
            throw CoordinatorError(.invalidRequest, "bytes must be an integer in 1...\(allowed), the speed-test download size of this process")
        }
        if let wait = speedTestLimiter?.take(SpeedTestKey(workerID: session.workerID, direction: direction), at: clock.date) {
            metrics.speedTestsLimited.increment()
            throw .rateLimited(
                "worker '\(session.workerID)' ran a speed-test \(direction) less than \(configuration.speedTestInterval.secondsText) s ago", retryAfter: wait)
        }
        return allowed
    }

    /// The session (worker and process) a session token proves.
    public nonisolated func session(forToken token: String) async throws(CoordinatorError) -> DeviceSession {
        guard let sessions = sessionIssuer.withLock({ $0 }) else { throw .internalError("coordinator not started") }
        return try await sessions.session(from: token, now: clock.date)
    }

    /// Refuses a session used for a process other than the one it was issued for.
    func requireSessionProcess(_ session: DeviceSession, _ processID: String, _ runtime: Runtime) throws(CoordinatorError) {
        guard session.processID == processID else {
            throw CoordinatorError(
                .sessionProcessMismatch,
                "the session token was issued for \(session.processDescription), not for process '\(runtime.process.name)' version \(runtime.process.version); authenticate for that process"
            )
        }
    }

    /// The process a request key was issued by, refusing keys of another process's session or another worker.
    func keyedRuntime(requestKey: String, session: DeviceSession) throws(CoordinatorError) -> (processID: String, runtime: Runtime) {
        guard let processID = processForKey[requestKey], let runtime = runtimes[processID] else {
            if runtimes[session.processID] == nil {
                // The session's process is gone (deleted here or through another instance), and its keys with it.
                throw CoordinatorError(.unknownProcess, "the session's \(session.processDescription) is no longer hosted")
            }
            throw CoordinatorError(.invalidRequestKey, "request key is not one issued for an open cycle")
        }
        try requireSessionProcess(session, processID, runtime)
        if let owner = runtime.machine.owner(ofRequestKey: requestKey), owner != session.workerID {
            throw CoordinatorError(.invalidRequestKey, "request key was issued to another worker")
        }
        return (processID, runtime)
    }

    func requireKnownWorker(_ workerID: String) async throws(CoordinatorError) {
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
    ///   - session: What the session token proves.
    public func requestCycle(_ request: CycleRequest, session: DeviceSession) async throws(CoordinatorError) -> CycleResponse {
        try await requestCycle(request, session: session, catchingUp: true)
    }

    /// ``requestCycle(_:session:)``; with `catchingUp`, a cycle another instance closed meanwhile is taken up and the
    /// request decided again, once.
    func requestCycle(_ request: CycleRequest, session: DeviceSession, catchingUp: Bool) async throws(CoordinatorError) -> CycleResponse {
        guard request.workerID == session.workerID else {
            throw CoordinatorError(.forbidden, "the session token belongs to another worker")
        }
        if let failure = WireLimits.nameFailure(request.processName, field: "process_name") {
            throw CoordinatorError(.invalidRequest, failure)
        }
        for (field, value) in [("download_mbps", request.downloadMbps), ("upload_mbps", request.uploadMbps)] {
            if let value, !(value >= 0 && value.isFinite) {
                throw CoordinatorError(.invalidRequest, "\(field) must be a non-negative number of Mbit/s, not \(value)")
            }
        }
        try await requireKnownWorker(request.workerID)
        guard let processID = try await knownProcessID(name: request.processName, version: request.processVersion), let runtime = runtimes[processID]
        else {
            throw CoordinatorError(.unknownProcess, "no process '\(request.processName)' version \(request.processVersion)")
        }
        try requireSessionProcess(session, processID, runtime)
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
        if let evaluation = await offerEvaluation(request, runtime: runtime, processID: processID, now: now) {
            metrics.checkinsAccepted.increment()
            return .evaluate(evaluation)
        }
        if let tasks = request.tasks, !tasks.contains(.training) {
            // A window that takes no training (a short one, for evaluation only) is not admitted to the cycle. Without
            // evaluation in the process it has nothing to come back for soon.
            metrics.checkinsRejected.increment()
            let wait = server.evaluation == nil ? server.cycleLength : server.paceSteeringWindow * (1 + jitter)
            return .rejected(CycleRejection(retryAfter: wait.rounded(.up), reason: "no_evaluation_task"))
        }
        let key = randomHex(16)
        let decision = runtime.machine.requestCycle(workerID: request.workerID, now: now, newRequestKey: key, jitter: jitter)
        switch decision {
        case .rejected(let retryAfter, let reason):
            if store.isShared && catchingUp && (reason == "cycle_closing" || reason == "already_reported") {
                // Perhaps closed by another instance since the last tick (and a new one opened): take the store's cycle
                // up and decide again.
                let cycle = runtime.machine.cycle
                let closing = await catchUpShared(processID: processID)
                if let current = runtimes[processID], current.machine.cycle != cycle {
                    return try await requestCycle(request, session: session, catchingUp: false)
                }
                if closing {
                    // The cycle is being closed (here or at another instance) and the next opens in a moment.
                    metrics.checkinsRejected.increment()
                    return .rejected(CycleRejection(retryAfter: (1 + jitter * 4).rounded(.up), reason: "cycle_closing"))
                }
            }
            metrics.checkinsRejected.increment()
            return .rejected(CycleRejection(retryAfter: retryAfter, reason: reason))
        case .assigned(var assignment, let reportWithin, let isNew):
            let cycle = runtime.machine.cycle
            let checkpoint = runtime.machine.checkpoint
            if isNew && store.isShared {
                runtime.currentKeys.insert(assignment.requestKey)
                processForKey[assignment.requestKey] = processID
                switch try await admitShared(processID: processID, cycle: cycle, workerID: request.workerID, assignment: assignment, now: now, jitter: jitter) {
                case .assigned(let admitted):
                    assignment = admitted
                case .rejected(let rejection):
                    if catchingUp && rejection.reason == "cycle_closing" {
                        // Perhaps closed (or the process deleted) through another instance: take the store's view up and
                        // decide again.
                        await catchUpShared(processID: processID)
                        guard runtimes[processID] != nil else {
                            throw CoordinatorError(.unknownProcess, "no process '\(request.processName)' version \(request.processVersion)")
                        }
                        if let current = runtimes[processID], current.machine.cycle != cycle {
                            return try await requestCycle(request, session: session, catchingUp: false)
                        }
                    }
                    metrics.checkinsRejected.increment()
                    return .rejected(rejection)
                }
                metrics.openCycleAssigned.record(runtimes[processID]?.machine.assignments.count ?? 0)
            } else if isNew {
                runtime.currentKeys.insert(assignment.requestKey)
                processForKey[assignment.requestKey] = processID
                do {
                    try await store.recordAssignment(processID: processID, cycle: cycle, workerID: request.workerID, requestKey: assignment.requestKey, at: now)
                } catch {
                    // Undone wherever the assignment now is: a buffer released meanwhile carried it into the next one.
                    if let current = runtimes[processID], current.machine.assignments[request.workerID]?.requestKey == assignment.requestKey {
                        current.machine.revokeAssignment(workerID: request.workerID)
                        current.currentKeys.remove(assignment.requestKey)
                    }
                    processForKey[assignment.requestKey] = nil
                    if let closed = error as? StoreError, closed.code == .cycleClosed {
                        // The cycle closed while the admission was being written: ask again, for the one open now.
                        metrics.checkinsRejected.increment()
                        return .rejected(CycleRejection(retryAfter: 1, reason: "cycle_closing"))
                    }
                    throw storeFailure(error, "record the assignment")
                }
                metrics.openCycleAssigned.record(runtimes[processID]?.machine.assignments.count ?? 0)
            }
            metrics.checkinsAccepted.increment()
            return .accepted(
                CycleAssignment(
                    requestKey: assignment.requestKey, processID: processID, cycle: cycle, checkpoint: checkpoint,
                    modelID: "\(processID).\(checkpoint)", planID: processID,
                    reportWithin: reportWithin
                ))
        }
    }

    func assignedRuntime(requestKey: String, session: DeviceSession) throws(CoordinatorError) -> Runtime {
        let runtime = try keyedRuntime(requestKey: requestKey, session: session).runtime
        guard runtime.machine.assignments[session.workerID]?.requestKey == requestKey else {
            throw CoordinatorError(.invalidRequestKey, "request key is not one issued to this worker for an open cycle")
        }
        return runtime
    }

    /// The model a device was assigned, for download: the checkpoint's safetensors, or (`ModelFormat.mlmodel`) the
    /// process's architecture with the checkpoint's weights and its training settings as an updatable Core ML model,
    /// made once per checkpoint.
    /// - Throws: ``CoordinatorError`` `unsupported_format` when the model has something Core ML cannot express.
    public func model(_ modelID: String, requestKey: String, session: DeviceSession, format: ModelFormat = .safetensors) async throws(CoordinatorError)
        -> ModelDownload
    {
        let runtime: Runtime
        let checkpoint: Int
        if EvaluationKeys.isEvaluationKey(requestKey) {
            (runtime, checkpoint) = try await evaluationTask(requestKey: requestKey, session: session)
        } else {
            try await adoptSharedKey(requestKey, confirm: true)
            runtime = try assignedRuntime(requestKey: requestKey, session: session)
            checkpoint = runtime.machine.checkpoint
        }
        let expected = "\(runtime.process.id).\(checkpoint)"
        guard modelID == expected else {
            throw CoordinatorError(.unknownCheckpoint, "model '\(modelID)' is not the one assigned (\(expected))")
        }
        switch format {
        case .safetensors:
            return ModelDownload(bytes: runtime.checkpointBytes, etag: "\"\(expected)\"")
        case .mlmodel:
            let model: Result<[UInt8], CoordinatorError>
            if let cached = runtime.coreMLModel, cached.checkpoint == checkpoint {
                model = cached.model
            } else {
                coreMLExportAttempts += 1
                model = Result { () throws(CoordinatorError) in try Self.coreMLModel(process: runtime.process, checkpointBytes: runtime.checkpointBytes) }
                runtime.coreMLModel = (checkpoint, model)
            }
            return ModelDownload(bytes: try model.get(), etag: "\"\(expected).mlmodel\"", format: .mlmodel)
        }
    }

    /// The process's model with `checkpointBytes` as an updatable Core ML model. Its training settings follow the
    /// SDK's precedence (Orchard's defaults < the architecture's `training` < the client config's `batch_size`,
    /// `learning_rate`, `local_epochs`, `max_updates`), so a Core ML device trains as an Orchard device would.
    static func coreMLModel(process: StoredProcess, checkpointBytes: [UInt8]) throws(CoordinatorError) -> [UInt8] {
        var spec = process.model
        var training = spec.training ?? TrainingSpec(loss: .meanSquaredError)
        let client = process.clientConfig
        if let batchSize = client.batchSize { training.batchSize = batchSize }
        if let learningRate = client.learningRate { training.optimizer.learningRate = learningRate }
        if let epochs = client.localEpochs { training.epochs = epochs }
        if let maxUpdates = client.maxUpdates { training.maxUpdates = maxUpdates }
        spec.training = training
        let weights: [TensorRecord]
        do { weights = try Safetensors.decode(checkpointBytes).tensors } catch {
            throw CoordinatorError(.internalError, "the stored checkpoint of process '\(process.id)' does not decode: \(error)")
        }
        do {
            return try CoreMLExporter().export(spec, weights: weights)
        } catch {
            throw CoordinatorError(.unsupportedFormat, "process '\(process.id)' cannot be served as a Core ML model: \(error.description)")
        }
    }

    /// The training plan a device was assigned.
    public func plan(_ planID: String, requestKey: String, session: DeviceSession) async throws(CoordinatorError) -> TrainingPlan {
        let runtime: Runtime
        if EvaluationKeys.isEvaluationKey(requestKey) {
            runtime = try await evaluationTask(requestKey: requestKey, session: session).runtime
        } else {
            try await adoptSharedKey(requestKey, confirm: true)
            runtime = try assignedRuntime(requestKey: requestKey, session: session)
        }
        guard planID == runtime.process.id else {
            throw CoordinatorError(.notFound, "plan '\(planID)' is not the one assigned (\(runtime.process.id))")
        }
        let local = runtime.process.serverConfig.privacy?.devicePrivacy(minimumReports: runtime.process.serverConfig.releaseMinimum)
        let server = runtime.process.serverConfig
        return TrainingPlan(
            planID: planID, model: runtime.process.model, clientConfig: runtime.process.clientConfig, localPrivacy: local,
            secureAggregation: server.secureAggregation.map {
                SecureAggregationPlan(parameters: $0.parameters, maximumSampleCount: server.maximumSampleCount, stageTimeout: $0.stageTimeout)
            }
        )
    }
}

/// Which way a speed-test transfer goes, from the device's side.
public enum SpeedTestLeg: String, Sendable, Hashable, CustomStringConvertible {
    /// The coordinator sends bytes to the device.
    case download
    /// The device sends bytes to the coordinator.
    case upload

    public var description: String { rawValue }
}
