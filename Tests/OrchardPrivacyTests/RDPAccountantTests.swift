import OrchardPrivacy
import Testing

/// The accountant against Google's `dp-accounting` 0.6.0 (PyPI), `RdpAccountant` with its default orders (1.1…10.9 in
/// tenths, 11…63, 128, 256, 512, 1024, which the accountant now tracks too) composing `PoissonSampledDpEvent(q,
/// GaussianDpEvent(z))` T times; values computed on 2026-11-28 with `get_epsilon_and_optimal_order(δ)` by
/// `Reference/dp_accounting_references.py` beside this file. Settings from the literature (Abadi et al. 2016: q = 0.01,
/// z = 1.1, 10⁴ steps; McMahan et al. 2018 cross-device: q = 10⁻⁵), small-noise extremes, and small sampling rates
/// (q ≤ 10⁻³) with noise multipliers between 0.5 and 1, where the optimum falls between integer orders.
@Suite struct RDPAccountantTests {
    struct Reference: Sendable, CustomStringConvertible {
        var q: Double, z: Double, steps: Int, delta: Double, epsilon: Double, order: Double
        var description: String { "q=\(q) z=\(z) T=\(steps) δ=\(delta)" }
    }

    static let references: [Reference] = [
        Reference(q: 0.01, z: 1.1, steps: 10000, delta: 1e-05, epsilon: 5.632010670081592, order: 4.7),
        Reference(q: 0.001, z: 1.0, steps: 100000, delta: 1e-06, epsilon: 2.004045592380869, order: 12.0),
        Reference(q: 1e-05, z: 1.0, steps: 1000, delta: 1e-05, epsilon: 0.3366848058233395, order: 23.0),
        Reference(q: 0.1, z: 0.7, steps: 100, delta: 1e-05, epsilon: 16.439431469513035, order: 2.1),
        Reference(q: 0.01, z: 0.3, steps: 100, delta: 1e-05, epsilon: 32.08879000546581, order: 1.5),
        Reference(q: 1.0, z: 1.0, steps: 1, delta: 1e-05, epsilon: 4.728507067217623, order: 5.4),
        Reference(q: 0.1, z: 1.0, steps: 100, delta: 1e-05, epsilon: 7.903850223578231, order: 3.2),
        Reference(q: 0.004, z: 4.0, steps: 10000, delta: 1e-05, epsilon: 0.383767042658125, order: 40.0),
        Reference(q: 1e-05, z: 0.7, steps: 100, delta: 1e-05, epsilon: 0.8161988060088772, order: 11.0),
        Reference(q: 1e-05, z: 0.3, steps: 100, delta: 1e-05, epsilon: 5.946121451710057, order: 2.7),
        Reference(q: 0.001, z: 0.5, steps: 1000, delta: 1e-05, epsilon: 4.382144962527826, order: 3.4),
        Reference(q: 0.001, z: 0.6, steps: 10000, delta: 1e-06, epsilon: 3.9991858528326922, order: 4.4),
        Reference(q: 0.001, z: 0.8, steps: 3000, delta: 1e-05, epsilon: 1.2266675253530033, order: 8.4),
        Reference(q: 0.0005, z: 0.7, steps: 20000, delta: 1e-06, epsilon: 2.04926106975092, order: 6.9),
        Reference(q: 0.0001, z: 0.5, steps: 50000, delta: 1e-05, epsilon: 3.062040546072985, order: 4.3),
        Reference(q: 0.0001, z: 0.9, steps: 100000, delta: 1e-06, epsilon: 0.8032518552956803, order: 14.0),
        Reference(q: 0.0001, z: 1.0, steps: 10000, delta: 1e-05, epsilon: 0.4532628807732154, order: 18.0),
        Reference(q: 0.0002, z: 0.6, steps: 5000, delta: 1e-05, epsilon: 1.8540131415613856, order: 6.0),
    ]

    @Test(arguments: references)
    func epsilonAgreesWithDPAccounting(_ reference: Reference) throws {
        let result = try PrivacyAccountant.epsilon(samplingRate: reference.q, noiseMultiplier: reference.z, steps: reference.steps, delta: reference.delta)
        #expect(abs(result.epsilon - reference.epsilon) <= 0.005 * reference.epsilon, "ε \(result.epsilon) against \(reference.epsilon)")
        #expect(abs(result.order - reference.order) < 1e-9, "order \(result.order) against \(reference.order)")
    }

    /// One step's RDP at fractional orders, against dp-accounting's `_compute_rdp_poisson_subsampled_gaussian`
    /// (q = 0.01, z = 0.3): the two series of Mironov, Talwar and Zhang 2019 §3.3, with terms in absolute value.
    @Test(arguments: [(1.1, 0.02131051), (1.5, 0.10972482), (2.5, 6.2136736)])
    func fractionalOrdersAgreeWithDPAccounting(_ order: Double, _ expected: Double) {
        let rdp = RenyiDP.stepRDP(samplingRate: 0.01, noiseMultiplier: 0.3, order: order)
        #expect(abs(rdp - expected) <= 1e-6 * expected, "\(rdp)")
    }

    /// Near an integer order the fractional series bounds the exact binomial sum from above, and closely: α → 3.
    @Test func fractionalOrdersBoundTheIntegerOnesFromAbove() {
        for (q, z) in [(0.01, 1.0), (0.1, 0.7), (0.001, 2.0)] {
            let exact = RenyiDP.stepRDP(samplingRate: q, noiseMultiplier: z, order: 3)
            let near = RenyiDP.stepRDP(samplingRate: q, noiseMultiplier: z, order: 3 + 1e-9)
            #expect(near >= exact * (1 - 1e-6) && near <= exact * 1.01, "q=\(q) z=\(z): \(near) against \(exact)")
        }
    }

    @Test func composingStepByStepEqualsComposingAtOnce() throws {
        var accountant = PrivacyAccountant()
        for _ in 0..<100 { try accountant.spend(samplingRate: 0.1, noiseMultiplier: 1.0) }
        #expect(accountant.steps == 100)
        let once = try PrivacyAccountant.epsilon(samplingRate: 0.1, noiseMultiplier: 1.0, steps: 100, delta: 1e-5).epsilon
        #expect(abs(try accountant.epsilon(delta: 1e-5) - once) < 1e-9 * once)
        #expect(try PrivacyAccountant().epsilon(delta: 1e-5) == 0)
        // Zero steps spend nothing, even without noise (no 0 × ∞ poisoning the sums).
        var idle = PrivacyAccountant()
        try idle.spend(samplingRate: 0.5, noiseMultiplier: 0, steps: 0)
        #expect(try idle.epsilon(delta: 1e-5) == 0)
        #expect(idle.rdp.allSatisfy { $0 == 0 })
    }

    @Test func moreNoiseOrFewerStepsSpendLess() throws {
        let base = try PrivacyAccountant.epsilon(samplingRate: 0.01, noiseMultiplier: 1.0, steps: 1000, delta: 1e-5).epsilon
        #expect(try PrivacyAccountant.epsilon(samplingRate: 0.01, noiseMultiplier: 1.5, steps: 1000, delta: 1e-5).epsilon < base)
        #expect(try PrivacyAccountant.epsilon(samplingRate: 0.01, noiseMultiplier: 1.0, steps: 500, delta: 1e-5).epsilon < base)
        #expect(try PrivacyAccountant.epsilon(samplingRate: 0.005, noiseMultiplier: 1.0, steps: 1000, delta: 1e-5).epsilon < base)
    }

    @Test(arguments: [0.5, 1.0, 2.0, 8.0])
    func calibratedNoiseReachesTheTargetAndNoLess(target: Double) throws {
        let z = try PrivacyAccountant.noiseMultiplier(samplingRate: 0.01, steps: 1000, delta: 1e-5, targetEpsilon: target)
        #expect(try PrivacyAccountant.epsilon(samplingRate: 0.01, noiseMultiplier: z, steps: 1000, delta: 1e-5).epsilon <= target)
        #expect(try PrivacyAccountant.epsilon(samplingRate: 0.01, noiseMultiplier: z * 0.995, steps: 1000, delta: 1e-5).epsilon > target)
    }

    @Test func badInputsAreRefusedNamingTheValue() throws {
        #expect(throws: PrivacyError.self) { try PrivacyAccountant.epsilon(samplingRate: 1.5, noiseMultiplier: 1, steps: 1, delta: 1e-5) }
        #expect(throws: PrivacyError.self) { try PrivacyAccountant.epsilon(samplingRate: 0.1, noiseMultiplier: -1, steps: 1, delta: 1e-5) }
        #expect(throws: PrivacyError.self) { try PrivacyAccountant.epsilon(samplingRate: 0.1, noiseMultiplier: .nan, steps: 1, delta: 1e-5) }
        #expect(throws: PrivacyError.self) { try PrivacyAccountant.epsilon(samplingRate: 0.1, noiseMultiplier: 1, steps: -1, delta: 1e-5) }
        #expect(throws: PrivacyError.self) { try PrivacyAccountant.epsilon(samplingRate: 0.1, noiseMultiplier: 1, steps: 1, delta: 0) }
        #expect(throws: PrivacyError.self) { try PrivacyAccountant.noiseMultiplier(samplingRate: 0.1, steps: 10, delta: 1e-5, targetEpsilon: 0) }
        #expect(throws: PrivacyError(.unreachableTarget, "no noise multiplier up to 10^4 keeps epsilon at or below 1e-09")) {
            try PrivacyAccountant.noiseMultiplier(samplingRate: 1, steps: 1000, delta: 1e-5, targetEpsilon: 1e-9)
        }
        // No noise spends everything; no sampling spends nothing.
        #expect(try PrivacyAccountant.epsilon(samplingRate: 0.1, noiseMultiplier: 0, steps: 1, delta: 1e-5).epsilon == Double.infinity)
        #expect(try PrivacyAccountant.epsilon(samplingRate: 0, noiseMultiplier: 1, steps: 100, delta: 1e-5).epsilon == 0)
    }
}
