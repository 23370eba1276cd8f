import Crypto
import Foundation
import OrchardFormats
import OrchardML
import OrchardPrivacy
public import OrchardProtocol

/// The evaluation tasks of one process's latest checkpoint, as one coordinator instance hands them out: which workers
/// hold one, until when, and how many results the store holds. Pure: time and the random draw are passed in.
struct EvaluationTasks: Sendable {
    /// The checkpoint the tasks are for (-1 before the first).
    private(set) var checkpoint = -1
    /// Workers holding a task, with its deadline (seconds since 1970).
    private(set) var outstanding: [String: Double] = [:]
    /// Workers whose result is stored.
    private(set) var reported: Set<String> = []
    /// Results stored for the checkpoint (over every instance, as last read from the store).
    private(set) var received = 0
    /// Whether the checkpoint's evaluation is finalized.
    private(set) var finalized = false
    /// Whether the store's count and finalized flag were read for the checkpoint (once per checkpoint and instance: after
    /// a restart, or when another instance took the results, memory alone would offer tasks that cannot count).
    private(set) var synchronized = false

    /// Starts over for `number` when it is a newer checkpoint than the tasks are for (never for an older one).
    mutating func follow(checkpoint number: Int) {
        guard number > checkpoint else { return }
        self = EvaluationTasks()
        checkpoint = number
    }

    /// Takes the store's view of the checkpoint: the results it holds and whether it was finalized.
    mutating func synchronize(received count: Int, finalized isFinalized: Bool) {
        synchronized = true
        received = max(received, count)
        if isFinalized { finalized = true }
    }

    /// Marks the store as being read (so that concurrent check-ins do not read it too).
    mutating func beginSynchronizing() { synchronized = true }

    /// Whether `worker` gets an evaluation task at `now`, given a uniform draw in [0, 1): the checkpoint is one to
    /// evaluate, not finalized, short of its goal with room among the open tasks, and the worker has none and sent
    /// none for it. Records the task when it does.
    mutating func offer(worker: String, now: Double, config: FederatedEvaluationConfig, draw: Double) -> Bool {
        guard config.evaluates(checkpoint: checkpoint), !finalized, received < config.goal else { return false }
        // Expired tasks go first: a worker whose own task expired (it went away) may take a new one.
        outstanding = outstanding.filter { $0.value > now }
        guard outstanding[worker] == nil, !reported.contains(worker) else { return false }
        guard received + outstanding.count < config.capacity, draw < config.fraction else { return false }
        outstanding[worker] = now + config.reportWithin
        return true
    }

    /// A result of `worker` for the checkpoint was stored; the store holds `count` in all.
    mutating func stored(worker: String, count: Int) {
        outstanding[worker] = nil
        reported.insert(worker)
        received = max(received, count)
    }

    /// The checkpoint's evaluation was finalized (here or by another instance).
    mutating func finalize() { finalized = true }
}

/// Evaluation request keys: `e.<checkpoint>.<expiry>.<mac>`, an HMAC-SHA256 over the process, the worker, the
/// checkpoint and the expiry with a key derived from the coordinator's stored secret. Any instance that shares the
/// store verifies one without a lookup, and a restart does not invalidate the tasks it handed out.
struct EvaluationKeys: Sendable {
    private let key: SymmetricKey

    /// Keys derived from the coordinator's session secret (HKDF, so the two never act as each other).
    init(secret: [UInt8]) {
        key = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: secret), info: Array("orchard/evaluation-keys".utf8), outputByteCount: 32)
    }

    /// Whether a request key has the shape of an evaluation key (a cycle's keys are hex).
    static func isEvaluationKey(_ requestKey: String) -> Bool { requestKey.hasPrefix("e.") }

    /// The key for `worker`'s task on `checkpoint` of `processID`, valid until `expiry` (whole seconds since 1970).
    func make(processID: String, workerID: String, checkpoint: Int, expiry: Int) -> String {
        "e.\(checkpoint).\(expiry).\(mac(processID: processID, workerID: workerID, checkpoint: checkpoint, expiry: expiry))"
    }

    /// The checkpoint a key was issued for to `workerID` in `processID`; nil when it is not one, or forged, or for
    /// another worker or process. The expiry is returned for the caller to check.
    func verify(_ requestKey: String, processID: String, workerID: String) -> (checkpoint: Int, expiry: Int)? {
        let parts = requestKey.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0] == "e", let checkpoint = Int(parts[1]), checkpoint >= 0, let expiry = Int(parts[2]) else { return nil }
        let expected = mac(processID: processID, workerID: workerID, checkpoint: checkpoint, expiry: expiry)
        // Constant-time comparison of the hex digests.
        let given = Array(parts[3].utf8)
        let wanted = Array(expected.utf8)
        guard given.count == wanted.count else { return nil }
        var difference: UInt8 = 0
        for index in given.indices { difference |= given[index] ^ wanted[index] }
        return difference == 0 ? (checkpoint, expiry) : nil
    }

    private func mac(processID: String, workerID: String, checkpoint: Int, expiry: Int) -> String {
        let message = Array("evaluation\u{0}\(processID)\u{0}\(workerID)\u{0}\(checkpoint)\u{0}\(expiry)".utf8)
        let code = HMAC<SHA256>.authenticationCode(for: message, using: key)
        return code.prefix(16).map { String($0, radix: 16).leftPadded(to: 2) }.joined()
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String { count >= width ? self : String(repeating: "0", count: width - count) + self }
}

/// How a checkpoint's device results become its federated evaluation: the sample-weighted mean of every metric
/// (`rmse` and `perplexity` derived from the mean loss, as they do not average), or under
/// ``OrchardProtocol/EvaluationNoise`` the ratio of noised, clamped sums. Pure: the noise source is passed in.
enum FederatedEvaluationAggregate {
    /// The standard normal draws one noised release takes (``combine(_:checkpoint:loss:maximumSamples:noise:normals:epsilon:at:)``).
    static let normalsPerRelease = EvaluationNoise.releasedSums

    /// ``combine(_:checkpoint:loss:maximumSamples:noise:normals:epsilon:at:)`` with the normals drawn from `generator` (when noised).
    static func combine(
        _ results: [StoredEvaluationResult], checkpoint: Int, loss: LossType?, maximumSamples: Int? = nil, noise: EvaluationNoise?, epsilon: Double?,
        at date: Double, using generator: inout some RandomNumberGenerator
    ) -> CheckpointEvaluation {
        let normals = noise == nil ? [] : (0..<normalsPerRelease).map { _ in GaussianNoise.standardNormal(using: &generator) }
        return combine(
            results, checkpoint: checkpoint, loss: loss, maximumSamples: maximumSamples, noise: noise, normals: normals, epsilon: epsilon, at: date)
    }

    /// The federated evaluation of `checkpoint` from its stored results. Metrics that come out non-finite (a mean that
    /// overflowed, `perplexity` of a huge loss) are left out.
    /// - Parameters:
    ///   - results: The devices' results (at least one).
    ///   - loss: The model's loss (which second metric noised sums release: accuracy or MAE).
    ///   - maximumSamples: The largest sample count one result weighs in the mean when not noised (nil: its own count).
    ///   - noise: Noised sums, if the process asks for them.
    ///   - normals: ``normalsPerRelease`` standard normal draws, when noised (drawn by the caller, so the aggregate can
    ///     be computed inside the store's transaction).
    ///   - epsilon: The evaluation's ε through this release, when noised.
    static func combine(
        _ results: [StoredEvaluationResult], checkpoint: Int, loss: LossType?, maximumSamples: Int? = nil, noise: EvaluationNoise?, normals: [Double],
        epsilon: Double?, at date: Double
    ) -> CheckpointEvaluation {
        if let noise {
            return noised(results, checkpoint: checkpoint, loss: loss, noise: noise, normals: normals, epsilon: epsilon, at: date)
        }
        var totals: [String: (sum: Double, weight: Double)] = [:]
        // A sequence model's mean cross-entropy per position, kept apart from the metrics devices name.
        var logPerplexity = (sum: 0.0, weight: 0.0)
        var samples = 0
        for result in results {
            // Saturating: each count is at most `maximum_sample_count`, which an operator may set near Int.max.
            let (sum, overflow) = samples.addingReportingOverflow(result.samples)
            samples = overflow ? Int.max : sum
            let weight = Double(min(result.samples, maximumSamples ?? Int.max))
            // A sequence model's accuracy and perplexity are means over positions: weighed by them (scaled by the
            // cap as the samples are), perplexity through its logarithm, the mean cross-entropy per position.
            let positionWeight = result.positions.map { Double($0) * weight / Double(max(result.samples, 1)) }
            for (name, value) in result.metrics where value.isFinite {
                if let positionWeight, name == "perplexity" {
                    let log = Foundation.log(value)
                    if log.isFinite { logPerplexity = (logPerplexity.sum + positionWeight * log, logPerplexity.weight + positionWeight) }
                    continue
                }
                let w = positionWeight.map { Self.perPosition.contains(name) ? $0 : weight } ?? weight
                let old = totals[name] ?? (0, 0)
                totals[name] = (old.sum + w * value, old.weight + w)
            }
        }
        var metrics = totals.compactMapValues { $0.weight > 0 ? $0.sum / $0.weight : nil }
        derive(&metrics, meanLogPerplexity: logPerplexity.weight > 0 ? logPerplexity.sum / logPerplexity.weight : nil)
        metrics = metrics.filter { $0.value.isFinite }
        return CheckpointEvaluation(checkpoint: checkpoint, samples: samples, metrics: metrics, evaluatedAt: date, devices: results.count)
    }

    /// The metrics of a sequence model that are means over positions.
    static let perPosition: Set<String> = ["accuracy", "perplexity"]

    /// `rmse` and `perplexity`, where present, recomputed from the aggregated loss (a mean of square roots or of
    /// exponentials is not the root or exponential of the mean); a sequence model's perplexity from the mean
    /// cross-entropy per position over every device's positions.
    private static func derive(_ metrics: inout [String: Double], meanLogPerplexity: Double?) {
        if let meanLogPerplexity {
            metrics["perplexity"] = exp(meanLogPerplexity)
        } else if let loss = metrics["loss"], metrics["perplexity"] != nil {
            metrics["perplexity"] = exp(loss)
        }
        if let loss = metrics["loss"], metrics["rmse"] != nil { metrics["rmse"] = max(0, loss).squareRoot() }
    }

    /// The metrics a noised release sums: `loss`, then `accuracy` (cross-entropy) or `mae`.
    static func releasedMetrics(loss: LossType?) -> [String] { ["loss", loss == .crossEntropy ? "accuracy" : "mae"] }

    private static func noised(
        _ results: [StoredEvaluationResult], checkpoint: Int, loss: LossType?, noise: EvaluationNoise, normals: [Double], epsilon: Double?, at date: Double
    ) -> CheckpointEvaluation {
        precondition(normals.count == normalsPerRelease, "a noised release takes \(normalsPerRelease) normal draws")
        let cap = Double(noise.maximumSamples)
        // The metrics report time requires (``releasedMetrics(loss:)``), each with its bound: accuracy's is 1.
        let released = releasedMetrics(loss: loss).map { ($0, $0 == "accuracy" ? 1.0 : noise.lossBound) }
        var weight = 0.0
        var sums = [Double](repeating: 0, count: released.count)
        for result in results {
            let w = min(Double(result.samples), cap)
            weight += w
            for (index, (name, bound)) in released.enumerated() {
                sums[index] += w * min(max(result.metrics[name] ?? 0, 0), bound)
            }
        }
        let z = noise.noiseMultiplier
        let noisyWeight = weight + z * cap * normals[0]
        var metrics: [String: Double] = [:]
        for (index, (name, bound)) in released.enumerated() {
            let noisySum = sums[index] + z * cap * bound * normals[index + 1]
            metrics[name] = min(max(noisySum / max(noisyWeight, 1), 0), bound)
        }
        if loss == .meanSquaredError { metrics["rmse"] = (metrics["loss"] ?? 0).squareRoot() }
        return CheckpointEvaluation(
            checkpoint: checkpoint, samples: max(0, Int(noisyWeight.rounded())), metrics: metrics, evaluatedAt: date, devices: nil, epsilon: epsilon)
    }

    /// ε of `releases` noised federated evaluations of a process under `privacy`: each is a Gaussian mechanism with
    /// multiplier z/√3 on devices sampled at rate (evaluation capacity / population), composed in Rényi DP.
    static func epsilon(releases: Int, noise: EvaluationNoise, config: FederatedEvaluationConfig, privacy: PrivacyConfig) -> Double? {
        try? PrivacyAccountant.epsilon(
            samplingRate: privacy.samplingRate(capacity: config.capacity), noiseMultiplier: noise.accountedNoiseMultiplier, steps: releases,
            delta: privacy.delta
        ).epsilon
    }
}
