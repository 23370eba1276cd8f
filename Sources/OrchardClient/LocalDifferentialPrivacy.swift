import OrchardFormats
import OrchardPrivacy
import OrchardProtocol

/// Local differential privacy on the device: the whole update (every tensor, as one vector) is clipped to the
/// plan's L2 bound C, then N(0, (z·C)²) is added to every value, before the report is written; the coordinator
/// never sees the update without its noise.
enum LocalDifferentialPrivacy {
    /// The clipped and noised update.
    /// - Throws: `incompatible_model` when the plan's privacy settings are unusable.
    static func apply(_ privacy: LocalPrivacy, to update: LocalUpdate, using generator: inout some RandomNumberGenerator) throws(OrchardClientError) -> LocalUpdate {
        if let failure = privacy.validationFailure() { throw OrchardClientError(.incompatibleModel, "the plan's \(failure)") }
        var flat: [Float] = []
        flat.reserveCapacity(update.diff.reduce(0) { $0 + $1.values.count })
        for tensor in update.diff { flat.append(contentsOf: tensor.values) }
        Clipping.clip(&flat, to: privacy.clippingNorm)
        GaussianNoise.add(to: &flat, standardDeviation: privacy.noiseMultiplier * privacy.clippingNorm, using: &generator)
        var noised = update
        var offset = 0
        for index in noised.diff.indices {
            let count = noised.diff[index].values.count
            noised.diff[index].values = Array(flat[offset..<(offset + count)])
            offset += count
        }
        return noised
    }
}
