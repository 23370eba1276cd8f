import OrchardFormats
import OrchardProtocol
import OrchardSupport
import Testing

@testable import OrchardClient

/// Local differential privacy on the device: the whole update is clipped as one vector, then noised.
@Suite struct LocalPrivacyTests {
    func update(_ values: [[Float]]) -> LocalUpdate {
        LocalUpdate(
            diff: values.enumerated().map { TensorRecord(name: "t\($0.offset)", shape: [$0.element.count], values: $0.element) }, sampleCount: 9,
            metrics: ["loss": 1])
    }

    @Test func theUpdateIsClippedAcrossEveryTensorBeforeNoise() throws {
        // Norm 5 over two tensors (3, 4): clipped to 1 → (0.6, 0.8); noise of σ = 10⁻⁹ is invisible.
        var generator = SplitMix64(seed: 1)
        let clipped = try LocalDifferentialPrivacy.apply(LocalPrivacy(clippingNorm: 1, noiseMultiplier: 1e-9), to: update([[3], [4]]), using: &generator)
        #expect(abs(clipped.diff[0].values[0] - 0.6) < 1e-6 && abs(clipped.diff[1].values[0] - 0.8) < 1e-6)
        // The sample count and the metrics describe the local data without noise: they do not leave the device.
        #expect(clipped.sampleCount == 1 && clipped.metrics.isEmpty)
        #expect(clipped.diff.map(\.name) == ["t0", "t1"] && clipped.diff.map(\.shape) == [[1], [1]])
        // Within the bound: unchanged.
        let kept = try LocalDifferentialPrivacy.apply(LocalPrivacy(clippingNorm: 10, noiseMultiplier: 1e-9), to: update([[3], [4]]), using: &generator)
        #expect(abs(kept.diff[0].values[0] - 3) < 1e-6 && abs(kept.diff[1].values[0] - 4) < 1e-6)
    }

    @Test func frozenLayersStayZeroAndDoNotCountTowardTheNorm() throws {
        var generator = SplitMix64(seed: 4)
        let diff = LocalUpdate(
            diff: [
                TensorRecord(name: "embed.weight", shape: [2], values: [0, 0]),
                TensorRecord(name: "out.weight", shape: [2], values: [3, 4]),
            ], sampleCount: 1)
        let noised = try LocalDifferentialPrivacy.apply(
            LocalPrivacy(clippingNorm: 1, noiseMultiplier: 0.1), to: diff, frozenLayers: ["embed"], using: &generator)
        #expect(noised.diff[0].values == [0, 0])
        // Clipped to (0.6, 0.8), then noise of σ = 0.1.
        #expect(abs(noised.diff[1].values[0] - 0.6) < 0.5 && abs(noised.diff[1].values[1] - 0.8) < 0.5)
        #expect(noised.diff[1].values != [0.6, 0.8])
    }

    @Test func theNoiseHasStandardDeviationZTimesC() throws {
        var generator = SplitMix64(seed: 2)
        let n = 30_000
        let noised = try LocalDifferentialPrivacy.apply(
            LocalPrivacy(clippingNorm: 2, noiseMultiplier: 0.5), to: update([[Float](repeating: 0, count: n)]), using: &generator)
        let values = noised.diff[0].values.map(Double.init)
        let mean = values.reduce(0, +) / Double(n)
        let variance = values.reduce(0) { $0 + ($1 - mean) * ($1 - mean) } / Double(n - 1)
        // σ = 0.5 · 2 = 1; the sample variance's relative error is ~√(2/n) ≈ 0.8 %.
        #expect(abs(mean) < 0.03)
        #expect(abs(variance - 1) < 0.04, "\(variance)")
    }

    @Test func unusableSettingsFromAPlanAreRefused() {
        var generator = SplitMix64(seed: 3)
        // A coordinator cannot turn the noise off: z = 0 is refused like any unusable value.
        for privacy in [
            LocalPrivacy(clippingNorm: 0, noiseMultiplier: 1), LocalPrivacy(clippingNorm: 1, noiseMultiplier: -1),
            LocalPrivacy(clippingNorm: .nan, noiseMultiplier: 1),
            LocalPrivacy(clippingNorm: 1, noiseMultiplier: 0),
            // Each finite, their product not: the noise would overflow (it trapped in GaussianNoise before).
            LocalPrivacy(clippingNorm: 1e200, noiseMultiplier: 1e200), LocalPrivacy(clippingNorm: 1e20, noiseMultiplier: 1e11),
        ] {
            #expect(throws: OrchardClientError.self) { try LocalDifferentialPrivacy.apply(privacy, to: update([[1]]), using: &generator) }
        }
    }

    @Test func theNoiseIsSeededOnlyWhenAskedFor() {
        let a = ClientEnvironment.seeded(5, seedNoise: true), b = ClientEnvironment.seeded(5, seedNoise: true)
        #expect((0..<4).map { _ in a.noiseBits() } == (0..<4).map { _ in b.noiseBits() })
        // Seeded jitter alone keeps the system's generator for the noise.
        let c = ClientEnvironment.seeded(5), d = ClientEnvironment.seeded(5)
        #expect((0..<4).map { _ in c.noiseBits() } != (0..<4).map { _ in d.noiseBits() })
        #expect(c.random() == d.random())
        let system = ClientEnvironment.system
        #expect(system.noiseBits() != system.noiseBits())
    }
}
