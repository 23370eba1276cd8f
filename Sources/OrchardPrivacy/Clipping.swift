import Foundation

/// DP-FedAvg's per-update pieces (McMahan et al. 2018; Andrew et al. 2021): clipping an update to an L2 bound,
/// Gaussian noise, and the adaptive clipping bound that follows a quantile of the updates' norms.
public enum Clipping {
    /// Scales `values` down to an L2 norm of at most `bound` (unchanged when already within it); returns the norm
    /// before clipping, accumulated in Double.
    @discardableResult
    public static func clip(_ values: inout [Float], to bound: Double) -> Double {
        precondition(bound > 0 && bound.isFinite, "the clipping bound must be a positive number")
        let norm = values.reduce(0.0) { $0 + Double($1) * Double($1) }.squareRoot()
        if norm > bound {
            let factor = bound / norm
            for i in values.indices { values[i] = Float(Double(values[i]) * factor) }
        }
        return norm
    }
}

/// Gaussian noise from a random number generator: the polar (Marsaglia) method on 53-bit uniforms. Give it
/// `SystemRandomNumberGenerator` (cryptographically secure: getrandom on Linux, arc4random on Apple systems) for
/// privacy; a seeded generator only in tests.
public enum GaussianNoise {
    /// One sample of N(0, 1).
    public static func standardNormal(using generator: inout some RandomNumberGenerator) -> Double {
        while true {
            let u = Double.random(in: -1..<1, using: &generator)
            let v = Double.random(in: -1..<1, using: &generator)
            let s = u * u + v * v
            if s > 0 && s < 1 { return u * (-2 * log(s) / s).squareRoot() }
        }
    }

    /// Adds N(0, σ²) to every value.
    public static func add(to values: inout [Float], standardDeviation sigma: Double, using generator: inout some RandomNumberGenerator) {
        precondition(sigma >= 0 && sigma.isFinite, "the noise's standard deviation must be a finite number >= 0")
        guard sigma > 0 else { return }
        for i in values.indices { values[i] = Float(Double(values[i]) + sigma * standardNormal(using: &generator)) }
    }
}

/// The adaptive clipping bound of Andrew et al. 2021 (geometric update): after each cycle,
/// C ← C · exp(−η (b − γ)), where b is the fraction of the cycle's updates whose norm was at most C and γ the target
/// quantile; C settles where a fraction γ of the norms lie below it. (The paper also noises b for privacy; the
/// caller passes the fraction it may release.)
public struct AdaptiveClipping: Sendable, Hashable, Codable {
    /// The current bound C.
    public private(set) var norm: Double
    /// γ, the quantile of update norms the bound tracks.
    public let targetQuantile: Double
    /// η, the step of the geometric update.
    public let learningRate: Double

    enum CodingKeys: String, CodingKey {
        case norm
        case targetQuantile = "target_quantile"
        case learningRate = "learning_rate"
    }

    /// Starts at `initialNorm`.
    /// - Throws: `invalid_parameter` unless 0 < γ < 1, η > 0 and the initial norm is positive (all finite).
    public init(initialNorm: Double, targetQuantile: Double, learningRate: Double) throws(PrivacyError) {
        guard initialNorm > 0, initialNorm.isFinite else { throw PrivacyError(.invalidParameter, "initial_norm must be a positive number, not \(initialNorm)") }
        guard targetQuantile > 0, targetQuantile < 1 else { throw PrivacyError(.invalidParameter, "target_quantile must be in (0, 1), not \(targetQuantile)") }
        guard learningRate > 0, learningRate.isFinite else {
            throw PrivacyError(.invalidParameter, "learning_rate must be a positive number, not \(learningRate)")
        }
        norm = initialNorm
        self.targetQuantile = targetQuantile
        self.learningRate = learningRate
    }

    /// Moves the bound after a cycle in which a fraction `unclipped` (0…1) of the updates had norms at most ``norm``.
    public mutating func update(unclippedFraction unclipped: Double) {
        let b = min(max(unclipped, 0), 1)
        norm *= exp(-learningRate * (b - targetQuantile))
    }

    /// Moves the bound after a cycle, given the norms of its updates.
    public mutating func update(norms: [Double]) {
        guard !norms.isEmpty else { return }
        update(unclippedFraction: Double(norms.filter { $0 <= norm }.count) / Double(norms.count))
    }
}
