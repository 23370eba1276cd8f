public import OrchardML
import OrchardSupport

/// A device's split of its samples into a training part and a held-out part for federated evaluation
/// (`client_config.holdout_fraction`).
///
/// Sample `i` is held out when a hash of the device's seed and `i` falls below the fraction: the split is fixed once for
/// a device and the same in every window, a sample never changes sides, and samples appended later keep the earlier
/// ones where they were. The held-out part is never trained on.
public struct HoldoutSplit: Sendable {
    /// Positions of the training samples.
    public let training: [Int]
    /// Positions of the held-out samples.
    public let holdout: [Int]

    /// Splits `count` samples with `fraction` of them (in expectation) held out, by `seed`.
    public init(count: Int, fraction: Double, seed: UInt64) {
        var training: [Int] = []
        var holdout: [Int] = []
        training.reserveCapacity(count)
        for index in 0..<count {
            if Self.isHeldOut(index, fraction: fraction, seed: seed) { holdout.append(index) } else { training.append(index) }
        }
        self.training = training
        self.holdout = holdout
    }

    /// Whether sample `index` is held out: a SplitMix64 finalizer of the seed and the index, as a number in [0, 1),
    /// below `fraction`.
    public static func isHeldOut(_ index: Int, fraction: Double, seed: UInt64) -> Bool {
        guard fraction > 0 else { return false }
        let z = SplitMix64.mix(seed &+ SplitMix64.increment &* (UInt64(truncatingIfNeeded: index) &+ 1))
        return Double(z >> 11) / Double(1 << 53) < fraction
    }

    /// The training part of `dataset`.
    public func trainingPart<D: Dataset>(of dataset: D) -> DatasetSlice<D> { DatasetSlice(dataset, indices: training) }
    /// The held-out part of `dataset`.
    public func holdoutPart<D: Dataset>(of dataset: D) -> DatasetSlice<D> { DatasetSlice(dataset, indices: holdout) }
}
