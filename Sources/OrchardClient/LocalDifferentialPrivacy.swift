import OrchardFormats
import OrchardPrivacy
import OrchardProtocol

/// Local differential privacy on the device: the whole update (every trainable tensor, as one vector) is clipped to
/// the plan's L2 bound C, then N(0, (z·C)²) is added to every value, before the report is written; the coordinator
/// never sees the update without its noise. Tensors of frozen layers stay zero (they carry nothing to protect, and
/// the coordinator refuses a change to them). The report's sample count becomes 1 and its metrics are dropped: they
/// describe the local data and are not noised (under privacy the coordinator weighs every report the same anyway).
enum LocalDifferentialPrivacy {
    /// The clipped and noised update.
    /// - Throws: `incompatible_model` when the plan's privacy settings are unusable.
    /// - Parameter frozenLayers: Names of the model's frozen layers (a tensor `layer.name` belongs to `layer`).
    static func apply(
        _ privacy: LocalPrivacy, to update: LocalUpdate, frozenLayers: Set<String> = [], using generator: inout some RandomNumberGenerator
    ) throws(OrchardClientError) -> LocalUpdate {
        if let failure = privacy.validationFailure() { throw OrchardClientError(.incompatibleModel, "the plan's \(failure)") }
        let trainable = update.diff.indices.filter { index in
            !frozenLayers.contains(String(update.diff[index].name.split(separator: ".", maxSplits: 1).first ?? ""))
        }
        var flat: [Float] = []
        flat.reserveCapacity(trainable.reduce(0) { $0 + update.diff[$1].values.count })
        for index in trainable { flat.append(contentsOf: update.diff[index].values) }
        Clipping.clip(&flat, to: privacy.clippingNorm)
        GaussianNoise.add(to: &flat, standardDeviation: privacy.noiseMultiplier * privacy.clippingNorm, using: &generator)
        var noised = update
        noised.sampleCount = 1
        noised.metrics = [:]
        var offset = 0
        for index in trainable {
            let count = noised.diff[index].values.count
            noised.diff[index].values = Array(flat[offset..<(offset + count)])
            offset += count
        }
        return noised
    }
}
