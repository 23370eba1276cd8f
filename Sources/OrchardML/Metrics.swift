import Foundation
public import OrchardFormats

/// Evaluation measures over predictions and targets.
public enum Metrics {
    /// Fraction of rows whose largest prediction is at the target class index.
    /// - Parameters:
    ///   - predictions: `[count, classes]` scores or probabilities.
    ///   - labels: `count` class indices (as Float).
    public static func accuracy(predictions: Tensor, labels: [Float]) throws(EngineError) -> Double {
        guard predictions.rank == 2, predictions.shape[0] == labels.count, !labels.isEmpty else {
            throw EngineError(.shapeMismatch, "accuracy needs [count, classes] predictions for \(labels.count) labels, got \(predictions.shape)")
        }
        let hits = zip(predictions.argmaxRows(), labels).filter { Float($0) == $1 }.count
        return Double(hits) / Double(labels.count)
    }

    /// Root of the mean squared difference.
    public static func rootMeanSquaredError(predictions: Tensor, targets: Tensor) throws(EngineError) -> Double {
        try meanSquaredError(predictions: predictions, targets: targets).squareRoot()
    }

    /// Mean squared difference.
    public static func meanSquaredError(predictions: Tensor, targets: Tensor) throws(EngineError) -> Double {
        try checkSameCount(predictions, targets)
        return zip(predictions.scalars, targets.scalars).reduce(0.0) { $0 + Double(($1.0 - $1.1) * ($1.0 - $1.1)) } / Double(targets.count)
    }

    /// Mean absolute difference.
    public static func meanAbsoluteError(predictions: Tensor, targets: Tensor) throws(EngineError) -> Double {
        try checkSameCount(predictions, targets)
        return zip(predictions.scalars, targets.scalars).reduce(0.0) { $0 + Double(abs($1.0 - $1.1)) } / Double(targets.count)
    }

    private static func checkSameCount(_ a: Tensor, _ b: Tensor) throws(EngineError) {
        guard a.count == b.count, a.count > 0 else {
            throw EngineError(.shapeMismatch, "predictions \(a.shape) and targets \(b.shape) differ in size or are empty")
        }
    }
}

extension Model {
    /// Runs the model over a whole dataset in inference mode, in batches through a compiled plan.
    /// - Returns: The outputs, `[dataset.count] + outputShape`.
    public func predict(_ dataset: some Dataset, batchSize: Int = 256) throws(EngineError) -> Tensor {
        let n = dataset.count
        let plan = try CompiledModel(inferenceOf: self, batchCapacity: max(1, min(batchSize, n)))
        let routes = try plan.inputRoutes(for: dataset, checkTargets: false)
        let width = plan.outputCount
        var out = [Float](repeating: 0, count: n * width)
        var start = 0
        while start < n {
            let b = min(plan.batchCapacity, n - start)
            for j in 0..<b {
                for (i, route) in routes.enumerated() {
                    let w = plan.inputCounts[i]
                    dataset.copyInput(route, of: start + j, into: UnsafeMutableBufferPointer(start: plan.inputBuffers[i] + j * w, count: w))
                }
            }
            try plan.forward(batch: b, training: false)
            out.withUnsafeMutableBufferPointer { (buffer: inout UnsafeMutableBufferPointer<Float>) in
                (buffer.baseAddress! + start * width).update(from: plan.output, count: b * width)
            }
            start += b
        }
        return Tensor(shape: [n] + outputShape, scalars: out)
    }

    /// The dataset's targets as one tensor `[count] + targetShape`.
    static func targets(of dataset: some Dataset) -> Tensor {
        let w = dataset.targetSpec.elementCount
        var values = [Float](repeating: 0, count: dataset.count * w)
        values.withUnsafeMutableBufferPointer { buffer in
            for i in 0..<dataset.count {
                dataset.copyTarget(of: i, into: UnsafeMutableBufferPointer(rebasing: buffer[(i * w)..<((i + 1) * w)]))
            }
        }
        return Tensor(shape: [dataset.count] + dataset.targetSpec.shape, scalars: values)
    }

    /// Classification accuracy over a dataset whose targets are class indices.
    public func accuracy(on dataset: some Dataset, batchSize: Int = 256) throws(EngineError) -> Double {
        let predictions = try predict(dataset, batchSize: batchSize)
        return try Metrics.accuracy(
            predictions: predictions.reshaped([dataset.count, predictions.count / max(dataset.count, 1)]), labels: Self.targets(of: dataset).scalars)
    }

    /// Root mean squared error over a regression dataset.
    public func rootMeanSquaredError(on dataset: some Dataset, batchSize: Int = 256) throws(EngineError) -> Double {
        try Metrics.rootMeanSquaredError(predictions: try predict(dataset, batchSize: batchSize), targets: Self.targets(of: dataset))
    }

    /// Mean absolute error over a regression dataset.
    public func meanAbsoluteError(on dataset: some Dataset, batchSize: Int = 256) throws(EngineError) -> Double {
        try Metrics.meanAbsoluteError(predictions: try predict(dataset, batchSize: batchSize), targets: Self.targets(of: dataset))
    }

    /// Summed loss and hits of the model's predictions over `data`, whose targets are `targets` in order: for
    /// `crossEntropy` the negative log of the softmax output's probability of the target class per sample, and hits
    /// where the largest output is that class; otherwise the squared error per target value. A sequence output
    /// (`[T, classes]`, targets `[T]`) counts per position: a sample's loss is the mean over its positions that are not
    /// padding (``CompiledModel/paddingTarget``), and hits, positions and their summed loss are counted per position.
    ///
    /// A cross-entropy model whose output layer is not a softmax gives logits, as in training: the loss is taken from
    /// their log-sum-exp.
    ///
    /// The outputs are taken a part of the dataset at a time (at most `outputBudget` values, and at least `batchSize`
    /// samples), so a wide output over a large held-out file does not need gigabytes; the sums are the same.
    /// - Throws: `shapeMismatch` when the targets do not fit the loss on this output (one class index per sample or
    ///   per position, or one value per output value); `invalidArgument` for a class index that is not a whole number in
    ///   `0..<classes` (or the padding marker, for a sequence), or a regression target that is not finite.
    public func lossSums(
        on data: some Dataset, targets: some Collection<Float>, loss: LossType, batchSize: Int = 1000, outputBudget: Int = lossSumsOutputBudget
    ) throws(EngineError) -> LossSums {
        let n = data.count
        var sums = LossSums()
        guard n > 0 else { return sums }
        let targets = Array(targets)
        try checkTargets(targets, samples: n, loss: loss)
        let perSample = targets.count / n
        let batch = max(1, batchSize)
        let part = max(batch, outputBudget / max(1, outputShape.reduce(1, *)))
        if part >= n {
            accumulate(try predict(data, batchSize: batch).scalars, targets: targets, samples: n, loss: loss, into: &sums)
            return sums
        }
        var start = 0
        while start < n {
            let count = min(part, n - start)
            let output = try predict(DatasetSlice(data, indices: Array(start..<(start + count))), batchSize: batch).scalars
            accumulate(output, targets: Array(targets[(start * perSample)..<((start + count) * perSample)]), samples: count, loss: loss, into: &sums)
            start += count
        }
        return sums
    }

    /// The most output values ``lossSums(on:targets:loss:batchSize:outputBudget:)`` holds at once by default (16 MiB).
    public static let lossSumsOutputBudget = 1 << 22

    /// Checks that `targets` are what `loss` needs on this model's output for `n` samples, as training does.
    private func checkTargets(_ targets: [Float], samples n: Int, loss: LossType) throws(EngineError) {
        let classes = outputShape.last ?? 1
        let perSample = loss == .crossEntropy ? (outputShape.count == 1 ? 1 : outputShape.dropLast().reduce(1, *)) : outputShape.reduce(1, *)
        guard targets.count == n * perSample else {
            throw EngineError(
                .shapeMismatch,
                "\(targets.count) target values for \(n) samples do not fit loss \(loss) on output \(outputShape): expected \(perSample) per sample")
        }
        for (index, t) in targets.enumerated() {
            if loss == .crossEntropy {
                if perSample > 1 && t == CompiledModel.paddingTarget { continue }
                guard t >= 0, t < Float(classes), t == t.rounded(.towardZero) else {
                    throw EngineError(
                        .invalidArgument,
                        "sample \(index / perSample): class index \(t) is not in 0..<\(classes)\(perSample > 1 ? " (or \(Int(CompiledModel.paddingTarget)) for padding)" : "")"
                    )
                }
            } else if !t.isFinite {
                throw EngineError(.invalidArgument, "sample \(index / perSample): target value \(t) is not finite")
            }
        }
    }

    /// Whether a cross-entropy output is probabilities (the output layer is a softmax) rather than logits.
    var outputIsProbabilities: Bool { layers.last { $0.name == output } is Softmax }

    /// Adds `n` samples' losses (their outputs and targets in order, the targets checked) to `sums`.
    private func accumulate(_ output: [Float], targets: [Float], samples n: Int, loss: LossType, into sums: inout LossSums) {
        if loss == .crossEntropy {
            let classes = outputShape.last ?? 1
            let positions = output.count / n / classes
            let probabilities = outputIsProbabilities
            output.withUnsafeBufferPointer { p in
                for j in 0..<n {
                    var sampleLoss = 0.0
                    var counted = 0
                    for position in 0..<positions {
                        let index = j * positions + position
                        let target = targets[index]
                        if positions > 1 && target == CompiledModel.paddingTarget { continue }
                        let row = UnsafeBufferPointer(rebasing: p[(index * classes)..<((index + 1) * classes)])
                        let label = Int(target)
                        let value: Double
                        if probabilities {
                            value = -Foundation.log(Double(max(row[label], 1e-12)))
                        } else {
                            // Logits: the log-sum-exp less the target's logit.
                            var m = -Float.infinity
                            for k in 0..<classes { m = max(m, row[k]) }
                            var total = 0.0
                            for k in 0..<classes { total += Foundation.exp(Double(row[k] - m)) }
                            value = Foundation.log(total) + Double(m) - Double(row[label])
                        }
                        sampleLoss += value
                        counted += 1
                        var best = 0
                        for k in 1..<classes where row[k] > row[best] { best = k }
                        if best == label { sums.hits += 1 }
                    }
                    sums.loss += counted == 0 ? 0 : sampleLoss / Double(counted)
                    sums.positions += counted
                    sums.positionLoss += sampleLoss
                }
            }
        } else {
            for (p, t) in zip(output, targets) {
                sums.loss += Double((p - t) * (p - t))
                sums.absolute += Double(abs(p - t))
            }
        }
    }

    /// The model's quality on `data` as the extensible set of metrics reports, `orchard evaluate` and the coordinator
    /// keep: the sample count and mean loss, then accuracy for a classifier (cross-entropy) or RMSE and MAE for a
    /// regressor.
    public func evaluationMetrics(on data: some Dataset, loss: LossType, batchSize: Int = 1000) throws(EngineError) -> EvaluationMetrics {
        guard data.count > 0 else { throw EngineError(.invalidArgument, "the dataset is empty: there is nothing to evaluate on") }
        let sums = try lossSums(on: data, targets: Self.targets(of: data).scalars, loss: loss, batchSize: batchSize)
        let values = data.count * data.targetSpec.elementCount
        let (mean, accuracy) = sums.mean(samples: data.count, targetValues: values, loss: loss)
        var metrics = EvaluationMetrics(samples: data.count, loss: mean)
        if let accuracy {
            metrics.values["accuracy"] = accuracy
            if outputShape.count > 1 {
                metrics.positions = sums.positions
                if let perplexity = sums.perplexity { metrics.values["perplexity"] = perplexity }
            }
        } else {
            metrics.values["rmse"] = mean.squareRoot()
            metrics.values["mae"] = sums.absolute / Double(max(values, 1))
        }
        return metrics
    }

    /// Mean loss and (classifiers) accuracy of the model over a dataset (``lossSums(on:targets:loss:batchSize:outputBudget:)``).
    public func evaluate(on data: some Dataset, loss: LossType, batchSize: Int = 1000) throws(EngineError) -> (loss: Double, accuracy: Double?) {
        let sums = try lossSums(on: data, targets: Self.targets(of: data).scalars, loss: loss, batchSize: batchSize)
        return sums.mean(samples: data.count, targetValues: data.count * data.targetSpec.elementCount, loss: loss)
    }
}

/// Summed loss (cross-entropy per sample, or squared error per target value) and hits over part of a dataset, to be
/// added up across parts in a fixed order.
public struct LossSums: Sendable, Hashable {
    /// The summed loss.
    public var loss = 0.0
    /// Samples whose largest output is the target class (classifiers).
    public var hits = 0
    /// The summed absolute error per target value (regressors).
    public var absolute = 0.0
    /// Positions counted by cross-entropy: one per sample for a classifier, the positions that are not padding for a
    /// sequence output.
    public var positions = 0
    /// The summed cross-entropy over those positions.
    public var positionLoss = 0.0

    /// Empty sums.
    public init() {}

    /// These sums plus `other`'s.
    public func adding(_ other: LossSums) -> LossSums {
        var sum = self
        sum.loss += other.loss
        sum.hits += other.hits
        sum.absolute += other.absolute
        sum.positions += other.positions
        sum.positionLoss += other.positionLoss
        return sum
    }

    /// Mean cross-entropy and accuracy (classifiers: per sample; sequences: per position that is not padding), or mean
    /// squared error and no accuracy (regressors).
    public func mean(samples: Int, targetValues: Int, loss type: LossType) -> (loss: Double, accuracy: Double?) {
        if type == .crossEntropy {
            let counted = positions > 0 ? positions : samples
            return (loss / Double(max(samples, 1)), Double(hits) / Double(max(counted, 1)))
        }
        return (loss / Double(max(targetValues, 1)), nil)
    }

    /// `exp` of the mean cross-entropy per position (a language model's perplexity), nil before any position.
    public var perplexity: Double? { positions > 0 ? Foundation.exp(positionLoss / Double(positions)) : nil }
}

/// A model's quality on a dataset: the sample count, the mean loss, and named metrics (`accuracy` for a classifier;
/// `rmse` and `mae` for a regressor). The names are an open set: a sequence model adds `perplexity`.
public struct EvaluationMetrics: Sendable, Hashable, Codable {
    /// Samples evaluated.
    public var samples: Int
    /// The mean loss (cross-entropy per sample, or squared error per target value).
    public var loss: Double
    /// The other metrics by snake_case name.
    public var values: [String: Double]
    /// For a sequence output, the positions scored (those that are not padding): `accuracy` and `perplexity` are means
    /// over them, so results of several datasets combine weighted by it; nil otherwise.
    public var positions: Int?

    /// Creates metrics.
    public init(samples: Int, loss: Double, values: [String: Double] = [:], positions: Int? = nil) {
        self.samples = samples
        self.loss = loss
        self.values = values
        self.positions = positions
    }

    /// Every metric by name, the loss, the sample count and (sequences) the positions included (the JSON object
    /// `orchard evaluate --json` prints).
    public var all: [String: Double] {
        var all = values.merging(["loss": loss, "samples": Double(samples)]) { _, new in new }
        if let positions { all["positions"] = Double(positions) }
        return all
    }
}
