public import OrchardPrivacy
public import OrchardProtocol
import Foundation

/// What a process's released aggregates have cost in privacy, and the clipping bound of its open cycle: stored
/// with every aggregated cycle (JSON), so a restarted coordinator goes on from it.
public struct PrivacyLedger: Sendable, Hashable, Codable {
    /// Aggregates released (cycles aggregated under privacy).
    public var releases: Int
    /// ε spent by those releases at the process's δ.
    public var epsilon: Double
    /// The L2 bound reports of the open cycle are clipped to (moves with adaptive clipping).
    public var clippingNorm: Double

    enum CodingKeys: String, CodingKey {
        case releases, epsilon
        case clippingNorm = "clipping_norm"
    }

    /// Creates a ledger.
    public init(releases: Int, epsilon: Double, clippingNorm: Double) {
        self.releases = releases
        self.epsilon = epsilon
        self.clippingNorm = clippingNorm
    }
}

/// DP-FedAvg for one process, without I/O: which bound a report is clipped to, what a release costs, and how a
/// cycle's sum of clipped reports becomes the released mean (noise of σ = z·C, divided by the expected number of
/// reports, `goal_count`). Randomness is the caller's (the coordinator's cryptographically secure generator).
public struct PrivacyMechanism: Sendable, Hashable {
    /// The process's privacy configuration.
    public let config: PrivacyConfig
    /// The expected reports per cycle (the fixed denominator).
    public let goalCount: Int
    /// The sampling rate the accountant assumes: the most devices a cycle admits (`goal_count × over_selection`,
    /// all of whose reports may be summed) over the population.
    public let samplingRate: Double
    /// The noise multiplier the accountant charges per release (see `PrivacyConfig.aggregateNoiseMultiplier(minimumReports:)`).
    public let accountedNoiseMultiplier: Double
    /// The noise multiplier of the update itself (larger than z when adaptive clipping takes a share).
    public let updateNoiseMultiplier: Double
    /// One release's RDP at each of ``RenyiDP/defaultOrders`` (fixed for the process; T releases cost T times it).
    private let stepRDP: [Double]

    /// Prepares the mechanism of a validated configuration.
    public init(config: PrivacyConfig, server: ServerConfig) {
        self.config = config
        // In buffered mode a release is a full buffer: K reports, drawn (by assumption) from the population like a cycle.
        goalCount = server.releaseGoal
        samplingRate = config.samplingRate(capacity: server.releaseCapacity)
        accountedNoiseMultiplier = config.aggregateNoiseMultiplier(minimumReports: server.releaseMinimum)
        updateNoiseMultiplier = config.updateNoiseMultiplier(expectedReports: server.releaseGoal) ?? config.noiseMultiplier
        stepRDP = RenyiDP.defaultOrders.map { [samplingRate, accountedNoiseMultiplier] in
            RenyiDP.stepRDP(samplingRate: samplingRate, noiseMultiplier: accountedNoiseMultiplier, order: $0)
        }
    }

    /// The ledger before any release.
    public var initialLedger: PrivacyLedger {
        PrivacyLedger(releases: 0, epsilon: 0, clippingNorm: config.clippingNorm ?? config.adaptiveClipping?.initialNorm ?? 1)
    }

    /// ε after `releases` releases.
    public func epsilon(releases: Int) throws(PrivacyError) -> Double {
        guard releases >= 0 else { throw PrivacyError(.invalidParameter, "releases must be >= 0, not \(releases)") }
        guard config.delta > 0, config.delta < 1 else { throw PrivacyError(.invalidParameter, "delta must be in (0, 1), not \(config.delta)") }
        guard releases > 0 else { return 0 }
        return RenyiDP.epsilon(rdp: stepRDP.map { Double(releases) * $0 }, orders: RenyiDP.defaultOrders, delta: config.delta).epsilon
    }

    /// Whether one more release stays within `target_epsilon` (always, without a target).
    public func allowsRelease(after ledger: PrivacyLedger) throws(PrivacyError) -> Bool {
        guard let target = config.targetEpsilon else { return true }
        return try epsilon(releases: ledger.releases + 1) <= target
    }

    /// The bound the coordinator clips a report to: the ledger's in central mode; none in local mode, where the
    /// device clipped before adding its noise (clipping a noised update again would shrink the noise with it).
    public func serverClippingNorm(_ ledger: PrivacyLedger) -> Double? {
        config.mode == .central ? ledger.clippingNorm : nil
    }

    /// In local mode, the largest norm an honestly clipped and noised report of `dimension` trainable values has
    /// but with probability below 10⁻⁸: C·(1 + z·(√d + 6)) (the norm of d standard normals exceeds √d + t with
    /// probability at most e^(−t²/2)). A report above it was not noised as the plan says — refused, so that one device
    /// cannot move the model further than an honest one. Nil in central mode.
    public func localNormCeiling(dimension: Int) -> Double? {
        guard config.mode == .local, let clip = config.clippingNorm else { return nil }
        return clip * (1 + config.noiseMultiplier * (Double(dimension).squareRoot() + 6))
    }

    /// Turns a cycle's sum of clipped, equally weighted reports into the released mean diff and the next ledger.
    /// Central mode adds N(0, (z_Δ·C)²) to every value of the sum; both modes divide by `goal_count`. With adaptive
    /// clipping the centred count Σ(bᵢ − ½) — one device moves it by at most ½, the sensitivity z_Δ's split assumes —
    /// is released with N(0, σ_b²) noise, and b̃ = that/`goal_count` + ½ moves the bound (Andrew et al. 2021).
    /// - Parameters:
    ///   - sum: Σ of the clipped reports, per value.
    ///   - reports: How many reports the sum holds.
    ///   - unclipped: How many of them were within the bound.
    ///   - ledger: The ledger before this release.
    ///   - generator: The noise source.
    public func release(
        sum: [Double], reports: Int, unclipped: Int, ledger: PrivacyLedger, using generator: inout some RandomNumberGenerator
    ) throws(PrivacyError) -> (mean: [Float], ledger: PrivacyLedger) {
        let denominator = Double(goalCount)
        var mean = [Float](repeating: 0, count: sum.count)
        if config.mode == .central {
            let sigma = updateNoiseMultiplier * ledger.clippingNorm
            for i in sum.indices {
                mean[i] = Float((sum[i] + sigma * GaussianNoise.standardNormal(using: &generator)) / denominator)
            }
        } else {
            for i in sum.indices { mean[i] = Float(sum[i] / denominator) }
        }
        var next = ledger
        next.releases += 1
        next.epsilon = try epsilon(releases: next.releases)
        if let adaptive = config.adaptiveClipping {
            let sigmaB = config.countStandardDeviation(expectedReports: goalCount)
            let centred = Double(unclipped) - Double(reports) / 2
            let noisyFraction = (centred + sigmaB * GaussianNoise.standardNormal(using: &generator)) / denominator + 0.5
            var clipping = try AdaptiveClipping(initialNorm: ledger.clippingNorm, targetQuantile: adaptive.targetQuantile, learningRate: adaptive.learningRate)
            clipping.update(unclippedFraction: noisyFraction)
            next.clippingNorm = clipping.norm
        }
        return (mean, next)
    }
}
