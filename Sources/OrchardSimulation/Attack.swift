public import OrchardClient
public import OrchardProtocol
import Foundation
import OrchardFormats
public import OrchardML
import OrchardPrivacy
import OrchardSupport

/// What a poisoning device sends instead of its honest update (`orchard simulate --attack`).
public enum AttackKind: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// The honest diff times −scale (pushes the model the other way).
    case signFlip = "sign-flip"
    /// The honest diff times scale (a boosted update).
    case scaled
    /// Gaussian noise N(0, scale²) per value in place of the diff.
    case gaussian
    /// Honest training on labels mapped c → classes − 1 − c (data poisoning; the scale does not apply).
    case labelFlip = "label-flip"

    public var description: String { rawValue }

    /// The scale used when `--attack-scale` is not given: 10 for sign-flip and scaled, 1 for gaussian.
    public var defaultScale: Double { self == .gaussian ? 1 : 10 }
}

/// Poisoning devices in a simulation: which devices attack, and how. They run the real client and send their poison
/// over the real wire; only the update they compute differs.
public struct AttackConfiguration: Sendable, Hashable {
    /// The fraction of the devices that attack (rounded to the nearest whole device).
    public var fraction: Double
    /// What they send.
    public var kind: AttackKind
    /// The attack's scale (see ``AttackKind``).
    public var scale: Double

    /// Creates an attack.
    public init(fraction: Double, kind: AttackKind, scale: Double? = nil) {
        self.fraction = fraction
        self.kind = kind
        self.scale = scale ?? kind.defaultScale
    }

    /// The attacking devices of a fleet of `clients`: round(fraction × clients) of them, drawn by the seed.
    public func attackers(clients: Int, seed: UInt64) -> Set<Int> {
        let count = min(clients, Int((fraction * Double(clients)).rounded()))
        var random = OrchardRandom.derived(seed: seed, stream: 0xA77A_C4)
        var devices = Array(0..<clients)
        devices.shuffle(using: &random)
        return Set(devices.prefix(count))
    }

    /// A short description for summaries and reports, e.g. `sign-flip x10 by 20 % of the devices`.
    public var summary: String {
        let share = "\(Self.text(fraction * 100)) % of the devices"
        switch kind {
        case .labelFlip: return "label-flip by \(share)"
        case .gaussian: return "gaussian sigma \(Self.text(scale)) by \(share)"
        default: return "\(kind) x\(Self.text(scale)) by \(share)"
        }
    }

    /// A number without a trailing `.0`.
    static func text(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int(value)) : String(value)
    }

    /// The poisoned form of an honest update: sign-flip, scaled and gaussian change the diff of every trainable tensor
    /// (a frozen layer's diff stays zero, as the coordinator requires); label-flip is applied to the data instead.
    func poison(_ update: LocalUpdate, task: LocalTrainingTask, device: Int) -> LocalUpdate {
        var update = update
        let frozen = Set(task.model.spec.layers.filter(\.frozen).map(\.name))
        // Seeded by the cycle's training seed and the device, so a run is reproducible.
        var random = OrchardRandom.derived(seed: task.training.seed, stream: 0x6A55 &+ UInt64(device))
        let factor = Float(kind == .signFlip ? -scale : scale)
        for index in update.diff.indices {
            let layer = String(update.diff[index].name.split(separator: ".", maxSplits: 1).first ?? "")
            if frozen.contains(layer) { continue }
            switch kind {
            case .signFlip, .scaled:
                update.diff[index].values = update.diff[index].values.map { $0 * factor }
            case .gaussian:
                update.diff[index].values = update.diff[index].values.map { _ in Float(scale * GaussianNoise.standardNormal(using: &random)) }
            case .labelFlip:
                break
            }
        }
        return update
    }
}

/// A dataset whose class labels are mapped c → classes − 1 − c (a label-flipping device's local data).
struct LabelFlippedDataset: Dataset {
    let base: any Dataset
    let classes: Int

    var count: Int { base.count }
    var inputSpecs: [FeatureSpec] { base.inputSpecs }
    var targetSpec: FeatureSpec { base.targetSpec }

    func copyInput(_ input: Int, of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        base.copyInput(input, of: index, into: destination)
    }

    func copyTarget(of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        base.copyTarget(of: index, into: destination)
        destination[0] = Float(classes - 1) - destination[0]
    }
}

extension RobustAggregationConfig {
    /// Parses `median`, `trimmed-mean:β`, `multi-krum:f` or `multi-krum:f:m` (underscores work too).
    public init(parsing text: String) throws(SimulationError) {
        let parts = text.lowercased().replacingOccurrences(of: "_", with: "-").split(separator: ":", omittingEmptySubsequences: false).map(String.init)
        let failure = SimulationError(
            .invalidOption, "robust aggregation must be median, trimmed-mean:β with β in (0, 0.5), multi-krum:f or multi-krum:f:m, not '\(text)'")
        switch (parts.first, parts.count) {
        case ("median", 1):
            self = .median
        case ("trimmed-mean", 2):
            guard let trim = Double(parts[1]), trim > 0, trim < 0.5 else { throw failure }
            self = .trimmedMean(trim: trim)
        case ("multi-krum", 2), ("multi-krum", 3):
            guard let f = Int(parts[1]), f >= 0 else { throw failure }
            var selected: Int?
            if parts.count == 3 {
                guard let m = Int(parts[2]), m >= 1 else { throw failure }
                selected = m
            }
            self = .multiKrum(byzantine: f, selected: selected)
        default:
            throw failure
        }
    }
}
