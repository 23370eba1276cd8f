/// Differential privacy for a process (`server_config.privacy`): DP-FedAvg (McMahan et al. 2018) with a fixed or
/// adaptive clipping bound (Andrew et al. 2021), accounted with Rényi DP of the Poisson-subsampled Gaussian.
///
/// Under privacy every report weighs the same (sample counts are not used for weighting, which would let one device
/// move the sum by more than the clipping bound) and the noised sum is divided by the expected number of reports,
/// `goal_count` (fixed-denominator averaging), so one device's influence is at most the bound.
public struct PrivacyConfig: Sendable, Hashable, Codable {
    /// Where the noise is added.
    public struct Mode: Sendable, Hashable, Codable, CustomStringConvertible {
        private enum Value: String, Sendable, Hashable { case central, local, distributed }
        private let value: Value
        private init(_ value: Value) { self.value = value }

        /// The coordinator clips each report and adds N(0, (z·C)²) to the cycle's sum (it sees individual updates).
        public static let central = Mode(.central)
        /// Each device clips its update and adds N(0, (z·C)²) to it before it leaves the device (trusts no server).
        public static let local = Mode(.local)
        /// Under secure aggregation: each device clips its update and adds its share of the noise, N(0, (z·C)²/m)
        /// with m = `minimum_reports`, so that the sum of at least m masked updates carries N(0, (z·C)²); the
        /// coordinator, which sees only that sum, publishes no cycle with fewer survivors.
        public static let distributed = Mode(.distributed)

        public var description: String { value.rawValue }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            let raw = try container.decode(String.self)
            guard let value = Value(rawValue: raw) else {
                throw DecodingError.dataCorruptedError(
                    in: container, debugDescription: "server_config.privacy.mode '\(raw)' is not one of central, local, distributed")
            }
            self.value = value
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(value.rawValue)
        }
    }

    /// The adaptive clipping bound's settings (Andrew et al. 2021): the bound follows a quantile of the updates' norms.
    public struct AdaptiveClipping: Sendable, Hashable, Codable {
        /// γ: the fraction of updates the bound should leave unclipped.
        public var targetQuantile: Double
        /// η: the step of the geometric update C ← C·exp(−η(b̄ − γ)).
        public var learningRate: Double
        /// The bound of the first cycle.
        public var initialNorm: Double
        /// σ_b: the standard deviation of the noise on the count of unclipped reports; nil means
        /// max(goal_count / 20, noise_multiplier) (the paper's m/20, raised so the update keeps a finite share).
        public var countStandardDeviation: Double?

        enum CodingKeys: String, CodingKey, CaseIterable {
            case targetQuantile = "target_quantile"
            case learningRate = "learning_rate"
            case initialNorm = "initial_norm"
            case countStandardDeviation = "count_stddev"
        }

        /// Creates adaptive clipping settings (the paper's defaults: γ = 0.5, η = 0.2, C₀ = 0.1).
        public init(targetQuantile: Double = 0.5, learningRate: Double = 0.2, initialNorm: Double = 0.1, countStandardDeviation: Double? = nil) {
            self.targetQuantile = targetQuantile
            self.learningRate = learningRate
            self.initialNorm = initialNorm
            self.countStandardDeviation = countStandardDeviation
        }

        public init(from decoder: any Decoder) throws {
            try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.privacy.adaptive_clipping")
            let c = try decoder.container(keyedBy: CodingKeys.self)
            let d = AdaptiveClipping()
            targetQuantile = try c.decodeIfPresent(Double.self, forKey: .targetQuantile) ?? d.targetQuantile
            learningRate = try c.decodeIfPresent(Double.self, forKey: .learningRate) ?? d.learningRate
            initialNorm = try c.decodeIfPresent(Double.self, forKey: .initialNorm) ?? d.initialNorm
            countStandardDeviation = try c.decodeIfPresent(Double.self, forKey: .countStandardDeviation)
        }
    }

    /// Central (the default) or local.
    public var mode: Mode
    /// A fixed L2 clipping bound C per report; exactly one of this and ``adaptiveClipping`` is set.
    public var clippingNorm: Double?
    /// An adaptive clipping bound (central mode only).
    public var adaptiveClipping: AdaptiveClipping?
    /// z: the noise's standard deviation as a multiple of the clipping bound.
    public var noiseMultiplier: Double
    /// δ of the (ε, δ) guarantee; below 1/``population`` to mean anything.
    public var delta: Double
    /// The process completes instead of opening a cycle whose aggregate would take ε past this, if set.
    public var targetEpsilon: Double?
    /// The operator's estimate of the device population; the sampling rate is the cycle's capacity
    /// (`goal_count × over_selection`) over it.
    public var population: Int

    enum CodingKeys: String, CodingKey, CaseIterable {
        case mode, delta, population
        case clippingNorm = "clipping_norm"
        case adaptiveClipping = "adaptive_clipping"
        case noiseMultiplier = "noise_multiplier"
        case targetEpsilon = "target_epsilon"
    }

    /// Creates a privacy configuration.
    public init(
        mode: Mode = .central, clippingNorm: Double? = nil, adaptiveClipping: AdaptiveClipping? = nil, noiseMultiplier: Double,
        delta: Double = 1e-5, targetEpsilon: Double? = nil, population: Int
    ) {
        self.mode = mode
        self.clippingNorm = clippingNorm
        self.adaptiveClipping = adaptiveClipping
        self.noiseMultiplier = noiseMultiplier
        self.delta = delta
        self.targetEpsilon = targetEpsilon
        self.population = population
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.privacy")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        mode = try c.decodeIfPresent(Mode.self, forKey: .mode) ?? .central
        clippingNorm = try c.decodeIfPresent(Double.self, forKey: .clippingNorm)
        adaptiveClipping = try c.decodeIfPresent(AdaptiveClipping.self, forKey: .adaptiveClipping)
        noiseMultiplier = try c.decode(Double.self, forKey: .noiseMultiplier)
        delta = try c.decodeIfPresent(Double.self, forKey: .delta) ?? 1e-5
        targetEpsilon = try c.decodeIfPresent(Double.self, forKey: .targetEpsilon)
        population = try c.decode(Int.self, forKey: .population)
    }

    /// The Poisson sampling rate the accountant assumes: the most devices a cycle admits (all of whose reports may
    /// be summed) over the population.
    public func samplingRate(capacity: Int) -> Double { min(1, Double(capacity) / Double(population)) }

    /// σ_b, the standard deviation of the noise adaptive clipping adds to the count of unclipped reports:
    /// `count_stddev`, or max(m/20, z) for m expected reports (Andrew et al. use m/20).
    public func countStandardDeviation(expectedReports: Int) -> Double {
        adaptiveClipping?.countStandardDeviation ?? max(Double(expectedReports) / 20, noiseMultiplier)
    }

    /// The noise multiplier left for the update itself once the adaptive clipping count takes its share
    /// (Andrew et al. 2021, Theorem 1: z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2)); z itself for a fixed bound; nil when z is
    /// too small to pay for the count.
    public func updateNoiseMultiplier(expectedReports: Int) -> Double? {
        guard adaptiveClipping != nil else { return noiseMultiplier }
        guard noiseMultiplier > 0 else { return nil }
        let sigmaB = countStandardDeviation(expectedReports: expectedReports)
        let rest = 1 / (noiseMultiplier * noiseMultiplier) - 1 / (4 * sigmaB * sigmaB)
        return rest > 0 ? 1 / rest.squareRoot() : nil
    }

    /// The noise multiplier of the aggregate the accountant charges: z for central mode; for local mode the sum of
    /// `minimumReports` independently noised reports, z·√minimumReports (fewer reports cannot close a cycle); z for
    /// distributed mode, whose shares add up to z·C over at least `minimumReports` survivors.
    public func aggregateNoiseMultiplier(minimumReports: Int) -> Double {
        mode == .local ? noiseMultiplier * Double(minimumReports).squareRoot() : noiseMultiplier
    }

    /// What a device adds under local or distributed mode: clipping to C and noise of z·C (local) or z·C/√m with
    /// m = `minimumReports` (distributed: its share); nil in central mode or without a fixed clipping norm.
    public func devicePrivacy(minimumReports: Int) -> LocalPrivacy? {
        guard let clip = clippingNorm else { return nil }
        if mode == .local { return LocalPrivacy(clippingNorm: clip, noiseMultiplier: noiseMultiplier) }
        if mode == .distributed { return LocalPrivacy(clippingNorm: clip, noiseMultiplier: noiseMultiplier / Double(max(1, minimumReports)).squareRoot()) }
        return nil
    }

    /// A caution when δ is not below 1/population: an (ε, δ) guarantee then allows a mechanism that releases some
    /// device's data outright with probability δ·population; nil otherwise. (Allowed: papers quote ε at δ = 10⁻⁵ for
    /// populations of 10⁶, but the coordinator says so when a process is hosted.)
    public var deltaCaution: String? {
        guard delta >= 1 / Double(population) else { return nil }
        return
            "server_config.privacy.delta \(delta) is not below 1/population (\(1 / Double(population))): the guarantee allows one device in \(Int((1 / delta).rounded())) to be exposed; consider delta <= 1/population"
    }

    /// Describes the first invalid field, or nil when the configuration is usable.
    /// - Parameters:
    ///   - goalCount: The process's `goal_count`.
    ///   - capacity: The devices a cycle admits (`goal_count × over_selection`); `goalCount` when nil.
    public func validationFailure(goalCount: Int, capacity: Int? = nil) -> String? {
        let capacity = capacity ?? goalCount
        if clippingNorm == nil && adaptiveClipping == nil {
            return "server_config.privacy needs clipping_norm or adaptive_clipping"
        }
        if clippingNorm != nil && adaptiveClipping != nil {
            return "server_config.privacy takes clipping_norm or adaptive_clipping, not both"
        }
        if let norm = clippingNorm, !(norm > 0 && norm.isFinite) {
            return "server_config.privacy.clipping_norm must be a positive finite number, not \(norm)"
        }
        if let adaptive = adaptiveClipping {
            if mode != .central {
                return "server_config.privacy.adaptive_clipping needs mode central (devices that noise their own updates clip to a fixed clipping_norm)"
            }
            if !(adaptive.targetQuantile > 0 && adaptive.targetQuantile < 1) {
                return "server_config.privacy.adaptive_clipping.target_quantile must be in (0, 1), not \(adaptive.targetQuantile)"
            }
            if !(adaptive.learningRate > 0 && adaptive.learningRate.isFinite) {
                return "server_config.privacy.adaptive_clipping.learning_rate must be a positive finite number, not \(adaptive.learningRate)"
            }
            if !(adaptive.initialNorm > 0 && adaptive.initialNorm.isFinite) {
                return "server_config.privacy.adaptive_clipping.initial_norm must be a positive finite number, not \(adaptive.initialNorm)"
            }
            if let sigma = adaptive.countStandardDeviation, !(sigma > 0 && sigma.isFinite) {
                return "server_config.privacy.adaptive_clipping.count_stddev must be a positive finite number, not \(sigma)"
            }
        }
        if !(noiseMultiplier > 0 && noiseMultiplier <= 1000) {
            return "server_config.privacy.noise_multiplier must be in (0, 1000], not \(noiseMultiplier)"
        }
        if !(delta > 0 && delta < 1) { return "server_config.privacy.delta must be in (0, 1), not \(delta)" }
        if let target = targetEpsilon, !(target > 0 && target.isFinite) {
            return "server_config.privacy.target_epsilon must be a positive finite number, not \(target)"
        }
        if population < capacity {
            return "server_config.privacy.population (\(population)) must be at least the devices a cycle admits, goal_count × over_selection (\(capacity))"
        }

        if updateNoiseMultiplier(expectedReports: goalCount) == nil {
            let sigmaB = countStandardDeviation(expectedReports: goalCount)
            return
                "server_config.privacy.adaptive_clipping.count_stddev \(sigmaB) leaves no noise for the update: noise_multiplier \(noiseMultiplier) must be below 2·count_stddev"
        }
        return nil
    }
}
