import CoreMetrics
import Foundation
import Logging
import OrchardData
import OrchardFormats
import OrchardML
public import OrchardProtocol
import OrchardSupport

// Server-side evaluation: an operator's held-out data attached to a process, and every checkpoint the coordinator
// publishes evaluated on it off the request path.
extension Coordinator {
    /// Evaluations a process's history lists (the newest).
    public static let evaluationHistoryLimit = 200

    /// Attaches held-out data (the file `orchard data prepare` writes) to a process, replacing any: the data is checked
    /// by evaluating the latest checkpoint on it, and both are stored; later checkpoints are evaluated as they are
    /// published.
    /// - Throws: `payload_too_large` over ``CoordinatorConfiguration/maximumEvaluationDataBytes``; `invalid_request` for a
    ///   file that does not parse or does not fit the model, or a model whose loss is unknown; `unknown_process`.
    public func attachEvaluationData(processID: String, bytes: [UInt8]) async throws(CoordinatorError) -> ProcessEvaluations {
        let limit = configuration.maximumEvaluationDataBytes
        guard bytes.count <= limit else {
            throw CoordinatorError(.payloadTooLarge, "the evaluation data has \(bytes.count) bytes; the coordinator takes at most \(limit)")
        }
        let runtime = try await hostedRuntime(processID)
        let spec = runtime.process.model
        let checkpoint = runtime.process.latestCheckpoint
        let weights = runtime.checkpointBytes
        let result = try await offCooperativePool { () throws(CoordinatorError) -> (samples: Int, metrics: [String: Double]) in
            try Self.evaluate(model: spec, weights: weights, data: bytes)
        }
        do {
            try await store.setEvaluationData(processID: processID, data: (bytes, result.samples))
            try await recordEvaluation(
                CheckpointEvaluation(checkpoint: checkpoint, samples: result.samples, metrics: result.metrics, evaluatedAt: clock.date.timeIntervalSince1970),
                processID: processID)
        } catch let error as StoreError where error.code == .notFound {
            throw CoordinatorError(.unknownProcess, "no process '\(processID)'")
        } catch {
            throw storeFailure(error, "store the evaluation data")
        }
        // A checkpoint published while the data was being checked found none stored: evaluate the latest now.
        if let current = runtimes[processID], current.process.latestCheckpoint != checkpoint {
            scheduleEvaluation(
                processID: processID, checkpoint: current.process.latestCheckpoint, weights: current.checkpointBytes, model: current.process.model)
        }
        logger.info(
            "evaluation data attached",
            metadata: ["process": "\(processID)", "bytes": "\(bytes.count)", "samples": "\(result.samples)", "checkpoint": "\(checkpoint)"])
        return try await evaluations(processID: processID)
    }

    /// Removes a process's held-out data; its past evaluations stay in the history.
    public func removeEvaluationData(processID: String) async throws(CoordinatorError) {
        _ = try await hostedRuntime(processID)
        do {
            try await store.setEvaluationData(processID: processID, data: nil)
        } catch let error as StoreError where error.code == .notFound {
            throw CoordinatorError(.unknownProcess, "no process '\(processID)'")
        } catch {
            throw storeFailure(error, "remove the evaluation data")
        }
    }

    /// A process's server-side evaluations (the newest ``evaluationHistoryLimit``, oldest first) and what data is attached.
    public func evaluations(processID: String) async throws(CoordinatorError) -> ProcessEvaluations {
        _ = try await hostedRuntime(processID)
        do {
            let data = try await store.evaluationDataSize(processID: processID)
            return ProcessEvaluations(
                processID: processID, dataBytes: data?.bytes, dataSamples: data?.samples,
                evaluations: try await store.evaluations(processID: processID, limit: Self.evaluationHistoryLimit),
                federated: try await store.federatedEvaluations(processID: processID, limit: Self.evaluationHistoryLimit))
        } catch {
            throw storeFailure(error, "read the evaluations")
        }
    }

    /// The runtime of a hosted process (looked up in a shared store when this instance does not hold it).
    private func hostedRuntime(_ processID: String) async throws(CoordinatorError) -> Runtime {
        guard let runtime = try await knownRuntime(processID: processID) else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        return runtime
    }

    /// Waits for every evaluation scheduled so far to finish (tests, and an orderly stop).
    public func evaluationsSettled() async {
        while let (processID, task) = evaluationQueue.first {
            await task.value
            if evaluationQueue[processID] == task { evaluationQueue[processID] = nil }
        }
    }

    /// Queues the evaluation of a just-published checkpoint behind the process's earlier ones, if the process has
    /// evaluation data; runs off the request path and off the actor's thread.
    func scheduleEvaluation(processID: String, checkpoint: Int, weights: [UInt8], model: ModelSpec) {
        let previous = evaluationQueue[processID]
        let store = self.store
        let logger = self.logger
        evaluationQueue[processID] = Task {
            await previous?.value
            do {
                guard let data = try await store.evaluationData(processID: processID) else { return }
                let result = try await offCooperativePool { () throws(CoordinatorError) -> (samples: Int, metrics: [String: Double]) in
                    try Self.evaluate(model: model, weights: weights, data: data.bytes)
                }
                try await self.recordEvaluation(
                    CheckpointEvaluation(
                        checkpoint: checkpoint, samples: result.samples, metrics: result.metrics, evaluatedAt: self.clock.date.timeIntervalSince1970),
                    processID: processID)
            } catch {
                logger.error("could not evaluate a checkpoint", metadata: ["process": "\(processID)", "checkpoint": "\(checkpoint)", "error": "\(error)"])
            }
        }
    }

    /// After a restart: queues the latest checkpoint of each process with evaluation data that has no evaluation yet
    /// (published just before a crash, or by an instance that died before evaluating it).
    func scheduleMissingEvaluations() async {
        for runtime in runtimes.values.sorted(by: { $0.process.id < $1.process.id }) {
            let processID = runtime.process.id
            await finalizeSupersededEvaluations(processID: processID, latestAtGoal: true)
            do {
                guard try await store.evaluationData(processID: processID) != nil else { continue }
                let latest = runtime.process.latestCheckpoint
                if try await store.evaluations(processID: processID, limit: 1).last?.checkpoint == latest { continue }
                scheduleEvaluation(processID: processID, checkpoint: latest, weights: runtime.checkpointBytes, model: runtime.process.model)
            } catch {
                logger.warning("could not check the process's evaluations", metadata: ["process": "\(processID)", "error": "\(error)"])
            }
        }
    }

    /// Over a shared store (called by the timer once a second): evaluates a process's latest checkpoint when it has
    /// data attached, no evaluation, and was published longer than ``CoordinatorConfiguration/sealLease`` ago — the
    /// instance that published it should have evaluated it by then, and may have died first.
    func catchUpEvaluations(now: Date) async {
        guard store.isShared else { return }
        for processID in runtimes.keys.sorted() {
            guard let runtime = runtimes[processID], runtime.process.latestCheckpoint > 0 else { continue }
            let latest = runtime.process.latestCheckpoint
            if evaluationsCaughtUp[processID] == latest { continue }
            guard now.timeIntervalSince(runtime.machine.openedAt) >= configuration.sealLease.inSeconds else { continue }
            await finalizeSupersededEvaluations(processID: processID)
            do {
                let attached = try await store.evaluationDataSize(processID: processID) != nil
                let evaluated = try await store.evaluations(processID: processID, limit: 1).last?.checkpoint == latest
                guard let current = runtimes[processID], current.process.latestCheckpoint == latest else { continue }
                if attached && !evaluated {
                    logger.notice(
                        "evaluating a checkpoint another instance published and did not evaluate",
                        metadata: ["process": "\(processID)", "checkpoint": "\(latest)"])
                    scheduleEvaluation(processID: processID, checkpoint: latest, weights: current.checkpointBytes, model: current.process.model)
                }
                evaluationsCaughtUp[processID] = latest
            } catch {
                logger.warning("could not check the process's evaluations", metadata: ["process": "\(processID)", "error": "\(error)"])
            }
        }
    }

    private func recordEvaluation(_ evaluation: CheckpointEvaluation, processID: String) async throws {
        var evaluation = evaluation
        let nonFinite = evaluation.metrics.filter { !$0.value.isFinite }.keys.sorted()
        if !nonFinite.isEmpty {
            // JSON has no number for them: kept out of the record, and said.
            logger.warning(
                "a checkpoint's evaluation is not finite",
                metadata: ["process": "\(processID)", "checkpoint": "\(evaluation.checkpoint)", "metrics": "\(nonFinite)"])
            evaluation.metrics = evaluation.metrics.filter { $0.value.isFinite }
        }
        try await store.recordEvaluation(evaluation, processID: processID)
        if let process = runtimes[processID]?.process { metrics.recordEvaluation(process: process, evaluation: evaluation) }
        logger.info(
            "checkpoint evaluated",
            metadata: [
                "process": "\(processID)", "checkpoint": "\(evaluation.checkpoint)", "samples": "\(evaluation.samples)",
                "loss": "\(evaluation.metrics["loss"] ?? .nan)",
            ])
    }

    /// The metrics of `weights` on `data` (the engine's ``OrchardML/Model/evaluationMetrics(on:loss:)``, as
    /// `orchard evaluate` computes them), with the loss of the model's training section.
    static func evaluate(model spec: ModelSpec, weights: [UInt8], data: [UInt8]) throws(CoordinatorError) -> (samples: Int, metrics: [String: Double]) {
        guard let loss = spec.training?.loss else {
            throw CoordinatorError(.invalidRequest, "model '\(spec.name)' has no training section to take the evaluation loss from")
        }
        let dataset: TensorDataset
        do { dataset = try DeviceDataFile.decode(data) } catch {
            throw CoordinatorError(.invalidRequest, "the evaluation data is not a file `orchard data prepare` writes: \(error.message)")
        }
        do throws(EngineError) {
            var model = try Model(spec: spec)
            try model.loadWeights(safetensors: weights)
            let metrics = try model.evaluationMetrics(on: dataset, loss: loss)
            return (metrics.samples, metrics.values.merging(["loss": metrics.loss]) { _, loss in loss })
        } catch {
            throw CoordinatorError(.invalidRequest, "the evaluation data does not fit model '\(spec.name)': \(error.message)")
        }
    }
}

extension CoordinatorMetrics {
    /// Publishes a process's latest evaluation: `orchard_evaluation{metric}` per metric, `orchard_evaluation_samples` and
    /// `orchard_evaluation_checkpoint` (server-side), or the same under `orchard_federated_evaluation` (devices'
    /// held-out splits), labelled with the process's name and version.
    func recordEvaluation(process: StoredProcess, evaluation: CheckpointEvaluation, federated: Bool = false) {
        let base = [("process", process.name), ("version", process.version.description)]
        let prefix = federated ? "orchard_federated_evaluation" : "orchard_evaluation"
        for (name, value) in evaluation.metrics.sorted(by: { $0.key < $1.key }) where value.isFinite {
            Gauge(label: prefix, dimensions: base + [("metric", name)], factory: factory).record(value)
        }
        Gauge(label: prefix + "_samples", dimensions: base, factory: factory).record(evaluation.samples)
        Gauge(label: prefix + "_checkpoint", dimensions: base, factory: factory).record(evaluation.checkpoint)
    }
}
