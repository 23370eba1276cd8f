import Foundation
import OrchardSupport
public import OrchardFormats
import Synchronization

/// A value handed to the threads of `DispatchQueue.concurrentPerform`, which the caller waits for: it is used by
/// one of them at a time per part, never after the call returns.
private struct UncheckedSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

/// How to train: loss, optimizer, epochs, batch size, update cap and seed. Every field has a default.
public struct TrainingConfiguration: Sendable, Hashable {
    /// The loss.
    public var loss: LossType
    /// The optimizer and its hyper-parameters.
    public var optimizer: OptimizerSpec
    /// Passes over the data.
    public var epochs: Int
    /// Samples per update (the last batch of an epoch may be smaller).
    public var batchSize: Int
    /// Stop after this many updates in total, if set.
    public var maxUpdates: Int?
    /// Seed of the shuffle order and dropout masks.
    public var seed: UInt64
    /// Whether each epoch visits the samples in a seeded random order (otherwise in index order).
    public var shuffle: Bool
    /// Parts each batch is cut into, run forward and backward side by side on their own threads against the same
    /// weights, their gradients then summed for one optimizer step (data parallelism within a step). 1 runs the
    /// batch whole. Give each part's matrix products one thread (``GEMM/setThreads(_:)``) so the parts do not
    /// compete for cores. The update is the same as the whole batch's up to float rounding (the products sum in
    /// another order). Models with dropout take only 1 (their masks come from one seeded stream). The dataset is
    /// then read from several threads at once.
    public var batchShards: Int
    /// FedProx's μ (Li et al. 2020): the objective gains μ/2·‖w − w₀‖², w₀ the weights the trainer was created with
    /// (the model the device received), so every step's gradient gains μ·(w − w₀) on the trainable parameters, through
    /// the optimizer like the data's. 0 is plain training.
    public var proximalMu: Double

    /// Creates a configuration.
    public init(
        loss: LossType = .meanSquaredError, optimizer: OptimizerSpec = .sgd(), epochs: Int = 1, batchSize: Int = 32,
        maxUpdates: Int? = nil, seed: UInt64 = 0, shuffle: Bool = true, batchShards: Int = 1, proximalMu: Double = 0
    ) {
        self.batchShards = batchShards
        self.proximalMu = proximalMu
        self.loss = loss
        self.optimizer = optimizer
        self.epochs = epochs
        self.batchSize = batchSize
        self.maxUpdates = maxUpdates
        self.seed = seed
        self.shuffle = shuffle
    }

    /// Creates a configuration from a model spec's training section.
    public init(_ spec: TrainingSpec, seed: UInt64 = 0) {
        self.init(loss: spec.loss, optimizer: spec.optimizer, epochs: spec.epochs, batchSize: spec.batchSize, maxUpdates: spec.maxUpdates, seed: seed)
    }

    /// The updates a whole run over `samples` samples applies: `epochs × ⌈samples / batchSize⌉`, or the update
    /// cap when smaller.
    /// Saturates at `Int.max` rather than overflowing (a client config may set any positive epoch count).
    public func plannedUpdates(samples: Int) -> Int {
        let batchSize = max(1, batchSize)
        let batches = max(0, samples) / batchSize + (max(0, samples) % batchSize == 0 ? 0 : 1)
        let (product, overflow) = max(0, epochs).multipliedReportingOverflow(by: batches)
        let full = overflow ? Int.max : product
        return maxUpdates.map { min($0, full) } ?? full
    }
}

/// The loss and size of one epoch.
public struct EpochMetrics: Sendable, Hashable, Codable {
    /// The epoch, counted from 0.
    public var epoch: Int
    /// Mean training loss over the epoch's samples.
    public var loss: Double
    /// Samples seen in the epoch (fewer than the dataset when `maxUpdates` stopped it).
    public var samples: Int
    /// Updates applied in the epoch.
    public var updates: Int
}

/// Where a training run stands: the next batch to run and the running sums of the current epoch.
public struct TrainingPosition: Sendable, Hashable, Codable {
    /// The current epoch, from 0.
    public var epoch: Int
    /// The next batch of the current epoch, from 0.
    public var batch: Int
    /// Updates applied since the run began.
    public var updates: Int
    /// Summed per-sample loss of the current epoch so far.
    public var epochLossSum: Double
    /// Samples of the current epoch so far.
    public var epochSamples: Int
    /// Updates of the current epoch so far.
    public var epochUpdates: Int

    /// The start of a run.
    public static let start = TrainingPosition(epoch: 0, batch: 0, updates: 0, epochLossSum: 0, epochSamples: 0, epochUpdates: 0)
}

/// Everything needed to continue a run exactly: weights, optimizer state, position, seed, dropout stream and
/// the metrics of finished epochs. Resuming from it gives bit-identical results to an uninterrupted run.
public struct TrainingState: Sendable {
    /// The model with its current weights.
    public var model: Model
    /// The optimizer's state.
    public var optimizer: OptimizerState
    /// The next batch to run.
    public var position: TrainingPosition
    /// The seed of the shuffle order.
    public var seed: UInt64
    /// The dropout stream's state words.
    public var dropoutRandom: [UInt64]
    /// Metrics of the epochs already finished.
    public var completedEpochs: [EpochMetrics]
}

/// What a finished run produced.
public struct TrainingReport: Sendable {
    /// The trained model.
    public var model: Model
    /// Per-epoch metrics.
    public var epochs: [EpochMetrics]
    /// Total updates applied.
    public var updates: Int
    /// The final state (e.g. to keep training with more epochs).
    public var state: TrainingState
}

/// The result of ``Trainer/train(on:resumingFrom:progress:)``.
public enum TrainingOutcome: Sendable {
    /// Every epoch ran, or `maxUpdates` was reached.
    case completed(TrainingReport)
    /// The task was cancelled at a batch boundary; pass the state back to continue.
    case interrupted(TrainingState)

    /// The model as it stands.
    public var model: Model {
        switch self {
        case .completed(let r): r.model
        case .interrupted(let s): s.model
        }
    }

    /// The state to continue from.
    public var state: TrainingState {
        switch self {
        case .completed(let r): r.state
        case .interrupted(let s): s
        }
    }
}

/// Progress reported after every batch.
public struct TrainingProgress: Sendable, Hashable {
    /// The epoch, from 0.
    public var epoch: Int
    /// The batch just finished, from 0.
    public var batch: Int
    /// Batches per epoch.
    public var batchesPerEpoch: Int
    /// Updates applied so far.
    public var updates: Int
    /// Mean loss of the batch just finished.
    public var loss: Float
}

/// Trains a model on a ``Dataset`` with a compiled ``CompiledModel``.
///
/// Steady-state training allocates nothing per batch: the plan's buffers, the optimizer slots and the shuffle
/// order are allocated once. Cancellation of the calling task is checked at every batch boundary; the run then
/// returns ``TrainingOutcome/interrupted(_:)`` with a ``TrainingState`` that continues the same epoch at the same
/// batch with the same shuffle order.
public final class Trainer {
    /// The configuration.
    public let configuration: TrainingConfiguration
    /// The compiled model.
    public let plan: CompiledModel
    let optimizer: Optimizer
    private var order: [Int] = []
    private var position = TrainingPosition.start
    private var completedEpochs: [EpochMetrics] = []
    /// The other batch shards' plans (``TrainingConfiguration/batchShards`` − 1), sharing `plan`'s parameters.
    private let replicas: [CompiledModel]
    /// With FedProx: the weights the trainer was created with (w₀), which a restored state does not change.
    private let anchor: [Float]?

    /// Compiles `model` for the configuration's batch size.
    public init(model: Model, configuration: TrainingConfiguration = TrainingConfiguration()) throws(EngineError) {
        guard configuration.epochs >= 0 else { throw EngineError(.invalidArgument, "epochs must be ≥ 0, not \(configuration.epochs)") }
        if let cap = configuration.maxUpdates, cap < 0 {
            throw EngineError(.invalidArgument, "maxUpdates must be ≥ 0, not \(cap)")
        }
        guard configuration.proximalMu >= 0, configuration.proximalMu.isFinite else {
            throw EngineError(.invalidArgument, "proximalMu must be a non-negative number, not \(configuration.proximalMu)")
        }
        guard configuration.batchShards >= 1 else {
            throw EngineError(.invalidArgument, "batchShards must be ≥ 1, not \(configuration.batchShards)")
        }
        if configuration.batchShards > 1, let dropout = model.layers.first(where: { $0 is Dropout }) {
            throw EngineError(
                .invalidArgument,
                "batchShards \(configuration.batchShards) needs a model without dropout: layer '\(dropout.name)' draws its masks from one seeded stream")
        }
        self.configuration = configuration
        plan = try CompiledModel(model: model, batchCapacity: configuration.batchSize, loss: configuration.loss, dropoutSeed: configuration.seed)
        optimizer = try Optimizer(spec: configuration.optimizer, parameterCount: plan.parameterCount)
        let shards = min(configuration.batchShards, max(configuration.batchSize, 1))
        let shardCapacity = (configuration.batchSize + shards - 1) / shards
        var replicas: [CompiledModel] = []
        for _ in 1..<shards { replicas.append(try CompiledModel(replicaOf: plan, batchCapacity: shardCapacity)) }
        self.replicas = replicas
        anchor = configuration.proximalMu > 0 ? Array(UnsafeBufferPointer(start: plan.parameters, count: plan.parameterCount)) : nil
    }

    /// Adds FedProx's μ·(w − w₀) to `gradients` over `ranges`.
    private func addProximalGradient(_ anchor: [Float], gradients: UnsafeMutablePointer<Float>, ranges: [Range<Int>]) {
        let mu = Float(configuration.proximalMu)
        let w = plan.parameters
        anchor.withUnsafeBufferPointer { w0 in
            for range in ranges {
                for i in range { gradients[i] += mu * (w[i] - w0[i]) }
            }
        }
    }

    /// The model with the current weights.
    public var model: Model { plan.exportModel() }

    /// The current state (weights, optimizer, position).
    public var state: TrainingState {
        TrainingState(
            model: plan.exportModel(), optimizer: optimizer.state, position: position, seed: configuration.seed,
            dropoutRandom: plan.dropoutRandom.stateWords, completedEpochs: completedEpochs
        )
    }

    /// Loads a state saved by an earlier run of the same model and configuration.
    /// - Throws: `incompatible_checkpoint` for another seed, model or optimizer, or a position with a negative count.
    public func restore(_ state: TrainingState) throws(EngineError) {
        guard state.seed == configuration.seed else {
            throw EngineError(.incompatibleCheckpoint, "training state has seed \(state.seed), but the configuration's seed is \(configuration.seed)")
        }
        try plan.loadParameters(from: state.model)
        try optimizer.restore(state.optimizer)
        guard let dropoutRandom = OrchardRandom(state: state.dropoutRandom) else {
            throw EngineError(.invalidArgument, "a random generator state is four words, not all zero (got \(state.dropoutRandom))")
        }
        let p = state.position
        // A state file is input: a negative epoch or batch would trap where the order is derived or indexed. (The loss
        // sum may be NaN: a run that diverged is resumed as it was, and reported as diverged.)
        guard p.epoch >= 0, p.batch >= 0, p.updates >= 0, p.epochSamples >= 0, p.epochUpdates >= 0 else {
            throw EngineError(.incompatibleCheckpoint, "training state position \(p) has a negative count")
        }
        plan.dropoutRandom = dropoutRandom
        position = state.position
        completedEpochs = state.completedEpochs
    }

    /// Trains until every epoch has run, `maxUpdates` is reached, or the task is cancelled.
    /// - Parameters:
    ///   - dataset: The samples; its input names must match the model's inputs.
    ///   - state: A state from an interrupted run to continue; nil continues from the trainer's own position.
    ///   - progress: Called after every batch.
    public func train(
        on dataset: some Dataset, resumingFrom state: TrainingState? = nil, progress: ((TrainingProgress) -> Void)? = nil
    ) throws(EngineError) -> TrainingOutcome {
        if let state { try restore(state) }
        let routes = try plan.inputRoutes(for: dataset, checkTargets: true)
        let n = dataset.count
        guard n > 0 else { throw EngineError(.invalidArgument, "the dataset is empty") }
        let batchSize = configuration.batchSize
        let batchesPerEpoch = (n + batchSize - 1) / batchSize
        if order.count != n { order = Array(0..<n) }
        var orderEpoch = -1

        while position.epoch < configuration.epochs {
            if orderEpoch != position.epoch {
                fillOrder(epoch: position.epoch)
                orderEpoch = position.epoch
            }
            while position.batch < batchesPerEpoch {
                if let cap = configuration.maxUpdates, position.updates >= cap { return finish() }
                if Task.isCancelled { return .interrupted(self.state) }
                let start = position.batch * batchSize
                let b = min(batchSize, n - start)
                let lossSum: Double
                if !replicas.isEmpty && b > 1 {
                    lossSum = try shardedStep(dataset, routes: routes, start: start, count: b)
                } else {
                    loadBatch(dataset, into: plan, routes: routes, start: start, count: b)
                    try plan.forward(batch: b, training: true)
                    lossSum = try plan.lossAndGradient(batch: b)
                    // Plain SGD steps the dense layers inside back-propagation; the optimizer does the rest. With FedProx
                    // every gradient goes through the optimizer, its proximal term added first.
                    let descentRate = anchor == nil ? optimizer.plainDescentRate : nil
                    plan.backward(batch: b, descentRate: descentRate)
                    if let anchor { addProximalGradient(anchor, gradients: plan.gradients, ranges: plan.trainableRanges) }
                    optimizer.update(
                        parameters: plan.parameters, gradients: plan.gradients,
                        ranges: descentRate == nil ? plan.trainableRanges : plan.rangesNotUpdatedInBackward
                    )
                }
                position.batch += 1
                position.updates += 1
                position.epochUpdates += 1
                position.epochLossSum += lossSum
                position.epochSamples += b
                progress?(
                    TrainingProgress(
                        epoch: position.epoch, batch: position.batch - 1, batchesPerEpoch: batchesPerEpoch,
                        updates: position.updates, loss: Float(lossSum / Double(b))
                    ))
            }
            closeEpoch()
        }
        return finish()
    }

    private func closeEpoch() {
        completedEpochs.append(
            EpochMetrics(
                epoch: position.epoch, loss: position.epochSamples > 0 ? position.epochLossSum / Double(position.epochSamples) : 0,
                samples: position.epochSamples, updates: position.epochUpdates
            ))
        position.epoch += 1
        position.batch = 0
        position.epochLossSum = 0
        position.epochSamples = 0
        position.epochUpdates = 0
    }

    private func finish() -> TrainingOutcome {
        var epochs = completedEpochs
        if position.epochSamples > 0 {
            epochs.append(
                EpochMetrics(
                    epoch: position.epoch, loss: position.epochLossSum / Double(position.epochSamples),
                    samples: position.epochSamples, updates: position.epochUpdates
                ))
        }
        let state = self.state
        return .completed(TrainingReport(model: state.model, epochs: epochs, updates: position.updates, state: state))
    }

    /// The sample order of an epoch: a permutation derived from the seed and the epoch number alone.
    private func fillOrder(epoch: Int) {
        for i in order.indices { order[i] = i }
        guard configuration.shuffle else { return }
        var random = OrchardRandom.derived(seed: configuration.seed, stream: UInt64(epoch))
        random.shuffle(&order)
    }

    private func loadBatch(_ dataset: some Dataset, into plan: CompiledModel, routes: [Int], start: Int, count: Int) {
        for j in 0..<count {
            let sample = order[start + j]
            for (i, route) in routes.enumerated() {
                let width = plan.inputCounts[i]
                dataset.copyInput(route, of: sample, into: UnsafeMutableBufferPointer(start: plan.inputBuffers[i] + j * width, count: width))
            }
            dataset.copyTarget(of: sample, into: UnsafeMutableBufferPointer(start: plan.targets + j * plan.targetCount, count: plan.targetCount))
        }
    }

    /// One step with the batch cut into parts run side by side: each part's plan loads its samples and runs forward
    /// and backward against the shared weights, writing the gradient of its share of the batch mean; the parts'
    /// gradients are summed into `plan`'s and the optimizer takes one step. Returns the batch's summed loss.
    private func shardedStep(_ dataset: some Dataset, routes: [Int], start: Int, count: Int) throws(EngineError) -> Double {
        let plans = [plan] + replicas.prefix(min(replicas.count, count - 1))
        let parts = plans.count
        let results = Mutex<[Result<Double, EngineError>?]>(Array(repeating: nil, count: parts))
        let work = UncheckedSendable((plans: plans, dataset: dataset, trainer: self))
        DispatchQueue.concurrentPerform(iterations: parts) { part in
            let (plans, dataset, trainer) = work.value
            let size = count / parts + (part < count % parts ? 1 : 0)
            let offset = part * (count / parts) + min(part, count % parts)
            let shard = plans[part]
            let result = Result { () throws(EngineError) -> Double in
                trainer.loadBatch(dataset, into: shard, routes: routes, start: start + offset, count: size)
                try shard.forward(batch: size, training: true)
                let loss = try shard.lossAndGradient(batch: size, meanOver: count)
                shard.backward(batch: size)
                return loss
            }
            results.withLock { $0[part] = result }
        }
        var lossSum = 0.0
        for result in results.withLock({ $0 }) { lossSum += try result!.get() }
        // The parts' gradients are summed and the step applied in slices side by side, one per part: one pass over the
        // weights on each core instead of two on one.
        optimizer.step += 1
        let slices = Self.slices(of: plan.trainableRanges, into: parts)
        DispatchQueue.concurrentPerform(iterations: slices.count) { index in
            let (plans, _, trainer) = work.value
            let total = plans[0].gradients
            for replica in plans.dropFirst() {
                let part = replica.gradients
                for range in slices[index] {
                    for i in range { total[i] += part[i] }
                }
            }
            if let anchor = trainer.anchor { trainer.addProximalGradient(anchor, gradients: total, ranges: slices[index]) }
            trainer.optimizer.apply(parameters: plans[0].parameters, gradients: total, ranges: slices[index])
        }
        return lossSum
    }

    /// `ranges` cut into at most `count` groups of about equal length, in order: together they cover `ranges`
    /// exactly.
    static func slices(of ranges: [Range<Int>], into count: Int) -> [[Range<Int>]] {
        let total = ranges.reduce(0) { $0 + $1.count }
        guard count > 1, total > 0 else { return [ranges] }
        let share = (total + count - 1) / count
        var groups: [[Range<Int>]] = [[]]
        var room = share
        for range in ranges {
            var rest = range
            while !rest.isEmpty {
                if room == 0 {
                    groups.append([])
                    room = share
                }
                let take = rest.count <= room ? rest.count : room
                groups[groups.count - 1].append(rest.lowerBound..<(rest.lowerBound + take))
                rest = (rest.lowerBound + take)..<rest.upperBound
                room -= take
            }
        }
        return groups
    }
}

extension CompiledModel {
    /// For each model input, the position of the dataset input with the same name.
    func inputRoutes(for dataset: some Dataset, checkTargets: Bool) throws(EngineError) -> [Int] {
        var routes: [Int] = []
        for input in model.inputs {
            guard let i = dataset.inputSpecs.firstIndex(where: { $0.name == input.name }) else {
                throw EngineError(.invalidArgument, "the dataset has no input '\(input.name)' (it has \(dataset.inputSpecs.map(\.name)))")
            }
            guard dataset.inputSpecs[i].shape == input.shape else {
                throw EngineError(.shapeMismatch, "dataset input '\(input.name)' has shape \(dataset.inputSpecs[i].shape), the model expects \(input.shape)")
            }
            routes.append(i)
        }
        guard !checkTargets || dataset.targetSpec.elementCount == targetCount else {
            throw EngineError(
                .shapeMismatch,
                "dataset targets have shape \(dataset.targetSpec.shape); loss \(loss) on output \(model.outputShape) needs \(targetCount) value(s) per sample")
        }
        return routes
    }

}
