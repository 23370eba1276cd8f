import CoreMetrics
import Foundation
import Logging
import OrchardFormats
import OrchardPrivacy
public import OrchardProtocol
import OrchardSupport
import Synchronization

// Federated evaluation: devices run the latest checkpoint on their held-out split and send metrics only; the
// coordinator aggregates each checkpoint's results once (``FederatedEvaluationAggregate``) and keeps the aggregate.
extension Coordinator {
    /// An evaluation task for a device whose cycle request takes one, when the process's latest checkpoint wants
    /// results (``EvaluationTasks/offer(worker:now:config:draw:)``); nil to go on deciding on training.
    func offerEvaluation(_ request: CycleRequest, runtime: Runtime, processID: String, now: Date) async -> EvaluationAssignment? {
        guard let config = runtime.process.serverConfig.evaluation, request.tasks?.contains(.evaluation) == true,
            let keys = evaluationKeys.withLock({ $0 })
        else { return nil }
        let checkpoint = runtime.process.latestCheckpoint
        guard config.evaluates(checkpoint: checkpoint) else { return nil }
        runtime.evaluationTasks.follow(checkpoint: checkpoint)
        if !runtime.evaluationTasks.synchronized {
            // First check-in for this checkpoint at this instance: what the store already holds for it.
            runtime.evaluationTasks.beginSynchronizing()
            do {
                let finalized = (try await store.federatedEvaluations(processID: processID, limit: 1).last?.checkpoint ?? -1) >= checkpoint
                let received = try await store.evaluationResults(processID: processID, checkpoint: checkpoint).count
                guard let current = runtimes[processID], current.evaluationTasks.checkpoint == checkpoint else { return nil }
                current.evaluationTasks.synchronize(received: received, finalized: finalized)
            } catch {
                logger.warning("could not read the evaluation's progress", metadata: ["process": "\(processID)", "error": "\(error)"])
            }
        }
        guard let runtime = runtimes[processID], runtime.evaluationTasks.checkpoint == checkpoint else { return nil }
        let draw = Double.random(in: 0..<1, using: &random)
        guard runtime.evaluationTasks.offer(worker: request.workerID, now: now.timeIntervalSince1970, config: config, draw: draw) else { return nil }
        let expiry = Int((now.timeIntervalSince1970 + config.reportWithin).rounded(.up))
        metrics.evaluationTasksAssigned.increment()
        return EvaluationAssignment(
            requestKey: keys.make(processID: processID, workerID: request.workerID, checkpoint: checkpoint, expiry: expiry), processID: processID,
            checkpoint: checkpoint, modelID: "\(processID).\(checkpoint)", planID: processID, reportWithin: config.reportWithin)
    }

    /// The process and checkpoint of an evaluation key issued to the session's worker, refusing forged, foreign and
    /// expired keys and (``EvaluationTasks``) checkpoints that are no longer the latest.
    func evaluationTask(requestKey: String, session: DeviceSession) async throws(CoordinatorError) -> (runtime: Runtime, checkpoint: Int) {
        guard let keys = evaluationKeys.withLock({ $0 }) else { throw .internalError("coordinator not started") }
        guard let runtime = try await knownRuntime(processID: session.processID) else {
            throw CoordinatorError(.unknownProcess, "the session's \(session.processDescription) is no longer hosted")
        }
        guard runtime.process.serverConfig.evaluation != nil,
            let (checkpoint, expiry) = keys.verify(requestKey, processID: session.processID, workerID: session.workerID)
        else {
            throw CoordinatorError(.invalidRequestKey, "request key is not an evaluation task issued to this worker for this process")
        }
        guard Double(expiry) >= clock.date.timeIntervalSince1970 else {
            throw CoordinatorError(.deadlinePassed, "the evaluation task of checkpoint \(checkpoint) expired")
        }
        var current = runtime
        if checkpoint > current.process.latestCheckpoint && store.isShared {
            // Published through another instance since this one last looked.
            await catchUpShared(processID: session.processID)
            guard let refreshed = runtimes[session.processID] else {
                throw CoordinatorError(.unknownProcess, "the session's \(session.processDescription) is no longer hosted")
            }
            current = refreshed
        }
        guard checkpoint == current.process.latestCheckpoint else {
            throw CoordinatorError(
                .evaluationClosed, "checkpoint \(checkpoint) is no longer the latest (\(current.process.latestCheckpoint)); its evaluation is closed")
        }
        return (current, checkpoint)
    }

    /// Checks a result's `positions` against the model: required, and at most the samples' positions, for a model whose
    /// cross-entropy output is a sequence; absent for any other.
    static func checkPositions(_ report: EvaluationReport, model: ModelSpec) throws(CoordinatorError) {
        let shape = (try? model.layerShapes())?[model.output] ?? []
        guard model.training?.loss == .crossEntropy, shape.count > 1 else {
            if report.positions != nil {
                throw CoordinatorError(.invalidRequest, "positions is for a model with a sequence output; model '\(model.name)' has output \(shape)")
            }
            return
        }
        let perSample = shape.dropLast().reduce(1, *)
        guard let positions = report.positions else {
            throw CoordinatorError(
                .invalidRequest,
                "a result for model '\(model.name)' (a sequence output) carries positions, which its accuracy and perplexity are means over (protocol \(WireProtocol.evaluationPositionsVersion))"
            )
        }
        let (most, overflow) = report.samples.multipliedReportingOverflow(by: perSample)
        guard overflow || positions <= most else {
            throw CoordinatorError(.invalidRequest, "positions \(positions) is more than \(report.samples) samples of \(perSample) positions hold")
        }
    }

    /// Stores a device's evaluation result; the checkpoint's evaluation is finalized once its goal is met.
    /// - Throws: `forbidden` for another worker's report; `invalid_request` for a report without `loss`, with a non-finite
    ///   or badly named metric, or more than `EvaluationReport.maximumMetrics` (16); `invalid_sample_count`;
    ///   `invalid_request_key`, `deadline_passed`, `evaluation_closed`, `evaluation_already_received`.
    public func evaluationReport(_ report: EvaluationReport, session: DeviceSession) async throws(CoordinatorError) -> EvaluationReportResponse {
        guard report.workerID == session.workerID else { throw CoordinatorError(.forbidden, "the session token belongs to another worker") }
        if let failure = report.validationFailure() { throw CoordinatorError(.invalidRequest, failure) }
        let (runtime, checkpoint) = try await evaluationTask(requestKey: report.requestKey, session: session)
        let processID = runtime.process.id
        let maximum = runtime.process.serverConfig.maximumSampleCount
        guard report.samples <= maximum else {
            throw CoordinatorError(.invalidSampleCount, "samples \(report.samples) is not in 1...\(maximum)")
        }
        try Self.checkPositions(report, model: runtime.process.model)
        // Noised sums release fixed metrics: a result without one would count as 0 in it at full weight.
        if runtime.process.serverConfig.evaluation?.noise != nil {
            let needed = FederatedEvaluationAggregate.releasedMetrics(loss: runtime.process.model.training?.loss)
            if let missing = needed.first(where: { report.metrics[$0]?.isFinite != true }) {
                throw CoordinatorError(
                    .invalidRequest, "the result has no finite '\(missing)': under evaluation noise every result carries \(needed.joined(separator: " and "))")
            }
        }
        let count: Int
        do {
            count = try await store.recordEvaluationResult(
                StoredEvaluationResult(
                    checkpoint: checkpoint, workerID: report.workerID, samples: report.samples, metrics: report.metrics,
                    receivedAt: clock.date.timeIntervalSince1970, positions: report.positions),
                processID: processID)
        } catch let error as StoreError where error.code == .duplicate {
            throw CoordinatorError(.evaluationAlreadyReceived, "this worker already sent its result for checkpoint \(checkpoint)")
        } catch let error as StoreError where error.code == .cycleClosed {
            // Finalized, here or at another instance: no more tasks for it from this one.
            if let current = runtimes[processID], current.evaluationTasks.checkpoint == checkpoint { current.evaluationTasks.finalize() }
            throw CoordinatorError(.evaluationClosed, "the evaluation of checkpoint \(checkpoint) is finalized")
        } catch let error as StoreError where error.code == .notFound {
            throw CoordinatorError(.unknownProcess, "the session's \(session.processDescription) is no longer hosted")
        } catch {
            throw storeFailure(error, "store the evaluation result")
        }
        metrics.evaluationResults.increment()
        if let current = runtimes[processID] {
            current.evaluationTasks.follow(checkpoint: checkpoint)
            current.evaluationTasks.stored(worker: report.workerID, count: count)
            if let goal = current.process.serverConfig.evaluation?.goal, count >= goal {
                await finalizeFederatedEvaluation(processID: processID, checkpoint: checkpoint)
            }
        }
        return EvaluationReportResponse(checkpoint: checkpoint, resultsReceived: count)
    }

    /// Aggregates a checkpoint's stored results into its federated evaluation and records it, once over every instance
    /// (a second finalization only clears results that arrived in between). Failures are logged; the results stay
    /// stored for the next attempt.
    func finalizeFederatedEvaluation(processID: String, checkpoint: Int) async {
        guard let runtime = runtimes[processID], let config = runtime.process.serverConfig.evaluation else { return }
        let loss = runtime.process.model.training?.loss
        let privacy = runtime.process.serverConfig.privacy
        // The noise is drawn here, from the coordinator's generator; the aggregate is made inside the store's transaction.
        let normals =
            config.noise == nil
            ? [] : (0..<FederatedEvaluationAggregate.normalsPerRelease).map { _ in GaussianNoise.standardNormal(using: &random) }
        let date = clock.date.timeIntervalSince1970
        do {
            let recorded = try await store.finalizeFederatedEvaluation(processID: processID, checkpoint: checkpoint) { results, earlier in
                let epsilon = config.noise.flatMap { noise in
                    privacy.flatMap { FederatedEvaluationAggregate.epsilon(releases: earlier + 1, noise: noise, config: config, privacy: $0) }
                }
                return FederatedEvaluationAggregate.combine(
                    results, checkpoint: checkpoint, loss: loss, maximumSamples: config.maximumSamples, noise: config.noise, normals: normals, epsilon: epsilon,
                    at: date)
            }
            if let current = runtimes[processID], current.evaluationTasks.checkpoint == checkpoint { current.evaluationTasks.finalize() }
            guard let evaluation = recorded, let process = runtimes[processID]?.process else { return }
            metrics.recordEvaluation(process: process, evaluation: evaluation, federated: true)
            logger.info(
                "checkpoint evaluated by devices",
                metadata: [
                    "process": "\(processID)", "checkpoint": "\(checkpoint)", "samples": "\(evaluation.samples)",
                    "loss": "\(evaluation.metrics["loss"] ?? Double.nan)",
                ])
        } catch {
            logger.error(
                "could not finalize a federated evaluation", metadata: ["process": "\(processID)", "checkpoint": "\(checkpoint)", "error": "\(error)"])
        }
    }

    /// Finalizes every federated evaluation of a process's checkpoints older than its latest that still has results
    /// stored: after a publication (here or, over a shared store, at another instance) and at start-up; with
    /// `latestAtGoal`, also the latest's when its results already meet the goal (a crash came between the last result
    /// and its finalization).
    func finalizeSupersededEvaluations(processID: String, latestAtGoal: Bool = false) async {
        guard let runtime = runtimes[processID], let config = runtime.process.serverConfig.evaluation else { return }
        let latest = runtime.process.latestCheckpoint
        do {
            for checkpoint in try await store.pendingEvaluationCheckpoints(processID: processID) {
                if checkpoint < latest {
                    await finalizeFederatedEvaluation(processID: processID, checkpoint: checkpoint)
                } else if latestAtGoal, checkpoint == latest,
                    try await store.evaluationResults(processID: processID, checkpoint: checkpoint).count >= config.goal
                {
                    await finalizeFederatedEvaluation(processID: processID, checkpoint: checkpoint)
                }
            }
        } catch {
            logger.warning("could not list the pending federated evaluations", metadata: ["process": "\(processID)", "error": "\(error)"])
        }
    }
}
