public import OrchardSupport
import CoreMetrics
import Foundation
public import Logging
import OrchardFormats
public import OrchardProtocol
import Synchronization

// The device API: authentication, cycle requests, plan and model downloads.
extension Coordinator {
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

    func assignedRuntime(requestKey: String, workerID: String) throws(CoordinatorError) -> Runtime {
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
}
