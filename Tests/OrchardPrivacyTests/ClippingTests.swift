import OrchardPrivacy
import OrchardSupport
import Testing

/// Clipping, Gaussian noise and adaptive clipping with seeded generators.
@Suite struct ClippingTests {
    @Test func clippingScalesDownToTheBoundAndKeepsTheDirection() {
        var values: [Float] = [3, 4, 0, 0]  // norm 5
        let before = Clipping.clip(&values, to: 1)
        #expect(before == 5)
        #expect(abs(values[0] - 0.6) < 1e-6 && abs(values[1] - 0.8) < 1e-6 && values[2] == 0)
        var small: [Float] = [0.3, 0.4]
        #expect(abs(Clipping.clip(&small, to: 1) - 0.5) < 1e-7)
        #expect(small == [0.3, 0.4])
    }

    /// The noised sum's empirical mean and variance match N(0, σ²): 200,000 samples, σ = 2, seeded.
    @Test(arguments: [UInt64(1), 7, 2026])
    func noiseHasTheCalibratedVariance(seed: UInt64) {
        var generator = SplitMix64(seed: seed)
        var values = [Float](repeating: 10, count: 200_000)
        GaussianNoise.add(to: &values, standardDeviation: 2, using: &generator)
        let n = Double(values.count)
        let mean = values.reduce(0.0) { $0 + Double($1) } / n
        let variance = values.reduce(0.0) { $0 + (Double($1) - mean) * (Double($1) - mean) } / (n - 1)
        #expect(abs(mean - 10) < 4 * 2 / n.squareRoot())  // four standard errors
        #expect(abs(variance / 4 - 1) < 0.02)  // the variance estimate's relative s.e. is √(2/n) ≈ 0.3 %
        // Tails as a normal's: about 4.55 % beyond two standard deviations.
        let beyond = Double(values.filter { abs(Double($0) - 10) > 4 }.count) / n
        #expect(abs(beyond - 0.0455) < 0.003)
    }

    @Test func noNoiseLeavesValuesAlone() {
        var generator = SplitMix64(seed: 3)
        var values: [Float] = [1, 2, 3]
        GaussianNoise.add(to: &values, standardDeviation: 0, using: &generator)
        #expect(values == [1, 2, 3])
    }

    /// Norms |N(0, 1)| (half-normal, median 0.6745): the bound tracking γ = 0.5 settles at the median, from far
    /// above and far below.
    @Test(arguments: [0.01, 100.0])
    func adaptiveClippingConvergesToTheTargetQuantile(initial: Double) throws {
        var generator = SplitMix64(seed: 11)
        var clipping = try AdaptiveClipping(initialNorm: initial, targetQuantile: 0.5, learningRate: 0.2)
        var late: [Double] = []
        for round in 0..<600 {
            let norms = (0..<100).map { _ in abs(GaussianNoise.standardNormal(using: &generator)) }
            clipping.update(norms: norms)
            if round >= 400 { late.append(clipping.norm) }
        }
        let average = late.reduce(0, +) / Double(late.count)
        #expect(abs(average / 0.6745 - 1) < 0.05, "settled at \(average)")
    }

    @Test func adaptiveClippingTracksOtherQuantiles() throws {
        // γ = 0.9 of a half-normal: 1.645.
        var generator = SplitMix64(seed: 5)
        var clipping = try AdaptiveClipping(initialNorm: 1, targetQuantile: 0.9, learningRate: 0.2)
        var late: [Double] = []
        for round in 0..<800 {
            clipping.update(norms: (0..<100).map { _ in abs(GaussianNoise.standardNormal(using: &generator)) })
            if round >= 500 { late.append(clipping.norm) }
        }
        let average = late.reduce(0, +) / Double(late.count)
        #expect(abs(average / 1.645 - 1) < 0.05, "settled at \(average)")
    }

    @Test func badAdaptiveSettingsAreRefused() {
        #expect(throws: PrivacyError.self) { try AdaptiveClipping(initialNorm: 0, targetQuantile: 0.5, learningRate: 0.2) }
        #expect(throws: PrivacyError.self) { try AdaptiveClipping(initialNorm: 1, targetQuantile: 1, learningRate: 0.2) }
        #expect(throws: PrivacyError.self) { try AdaptiveClipping(initialNorm: 1, targetQuantile: 0.5, learningRate: .nan) }
    }
}
