import Foundation
public import OrchardSupport

/// An error in a privacy computation's input: a code and a message naming the value.
public struct PrivacyError: OrchardError, Hashable {
    /// What went wrong.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind { case invalidParameter, unreachableTarget }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        /// A parameter is out of its range (e.g. a sampling rate outside 0…1).
        public static let invalidParameter = Code(.invalidParameter)
        /// No noise multiplier in the searched range reaches the target ε.
        public static let unreachableTarget = Code(.unreachableTarget)
        public var description: String { kind.snakeCased }
    }

    /// The code.
    public var code: Code
    /// A message naming the value.
    public var message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
}

/// Rényi differential privacy of the Poisson-subsampled Gaussian mechanism (Mironov 2017; Mironov, Talwar and
/// Zhang 2019), at integer and fractional orders, and its conversion to (ε, δ) by the bound of Balle et al. 2020
/// (Prop. 12) — the computation of Google's `dp-accounting` and Opacus at the same orders.
public enum RenyiDP {
    /// The orders tracked: those of Google's `dp-accounting` (`DEFAULT_RDP_ORDERS`): 1.1…10.9 in tenths (where
    /// small sampling rates with noise multipliers below 1 find their optimum, between integers), 11…63, 128, 256, 512
    /// and 1024. An accountant stored with other orders keeps them.
    public static let defaultOrders: [Double] = {
        let tenths: [Double] = (1...99).map { 1 + Double($0) / 10 }
        let integers: [Double] = (11...63).map { Double($0) }
        return tenths + integers + [128, 256, 512, 1024]
    }()

    /// The RDP at order `alpha` (> 1) of one step of the Gaussian mechanism with noise multiplier `z` (σ /
    /// sensitivity) on a Poisson sample of rate `q`: log(A_α) / (α − 1), with A_α = E_{x∼N(0,z²)}[(1 − q + q·e^{(2x−1)/2z²})^α]
    /// — a finite binomial sum for integer α, and for fractional α an upper bound by two series split where
    /// q·e^{(2x−1)/2z²} = 1 − q (Mironov, Talwar and Zhang 2019, §3.3).
    public static func stepRDP(samplingRate q: Double, noiseMultiplier z: Double, order alpha: Double) -> Double {
        precondition(alpha > 1, "orders are above 1")
        if q == 0 { return 0 }
        if z == 0 { return .infinity }
        if q == 1 { return alpha / (2 * z * z) }
        let logA = alpha == alpha.rounded() ? logAInteger(q: q, z: z, alpha: Int(alpha)) : logAFractional(q: q, z: z, alpha: alpha)
        return logA / (alpha - 1)
    }

    /// log A_α for integer α: Σₖ C(α,k) (1−q)^{α−k} qᵏ exp((k²−k) / 2z²).
    static func logAInteger(q: Double, z: Double, alpha: Int) -> Double {
        let logQ = log(q), log1mQ = log1p(-q)
        var logA = -Double.infinity
        for k in 0...alpha {
            let term = logBinomial(alpha, k) + Double(k) * logQ + Double(alpha - k) * log1mQ + Double(k * k - k) / (2 * z * z)
            logA = logAdd(logA, term)
        }
        return logA
    }

    /// log A_α for fractional α (an upper bound). Below x₀ = z²·log(1/q − 1) + ½ the integrand expands in powers of
    /// q·e^{…}/(1 − q), above it in powers of (1 − q)/(q·e^{…}); the k-th term of each integrates against the Gaussian
    /// in closed form:
    ///   |C(α,k)| qᵏ (1−q)^{α−k} e^{(k²−k)/2z²} · ½erfc((k − x₀)/(√2 z))   and
    ///   |C(α,k)| (1−q)ᵏ q^{α−k} e^{(j²−j)/2z²} · ½erfc((x₀ − j)/(√2 z)),  j = α − k.
    /// The generalized binomial C(α,k) changes sign past k = α; like `dp-accounting` 0.6 the terms are added in
    /// absolute value, which bounds A_α from above (the accountant errs on the side of spending more). The sums end once
    /// both terms are falling and below e⁻³⁰ of the total; an order whose series has not settled after 10,000 terms
    /// gives +∞ (it is then never the optimum).
    static func logAFractional(q: Double, z: Double, alpha: Double) -> Double {
        let logQ = log(q), log1mQ = log1p(-q)
        let x0 = z * z * (log(1 / q - 1)) + 0.5
        let scale = 1 / (2.0.squareRoot() * z)
        var below = -Double.infinity, above = -Double.infinity
        var lastLower = -Double.infinity, lastUpper = -Double.infinity
        var logBinomial = 0.0
        for k in 0..<10_000 {
            if k > 0 { logBinomial += log(abs(alpha - Double(k) + 1)) - log(Double(k)) }
            let i = Double(k), j = alpha - Double(k)
            let lower = logBinomial + i * logQ + j * log1mQ + (i * i - i) / (2 * z * z) + log(0.5) + logErfc((i - x0) * scale)
            let upper = logBinomial + i * log1mQ + j * logQ + (j * j - j) / (2 * z * z) + log(0.5) + logErfc((x0 - j) * scale)
            below = logAdd(below, lower)
            above = logAdd(above, upper)
            let total = logAdd(below, above)
            if lower < lastLower && upper < lastUpper && max(lower, upper) < total - 30 { return total }
            lastLower = lower
            lastUpper = upper
        }
        return .infinity
    }

    /// log(erfc(x)), accurate where erfc underflows (the asymptotic series for large x).
    static func logErfc(_ x: Double) -> Double {
        if x < 20 { return Foundation.log(erfc(x)) }
        let x2 = x * x
        // erfc(x) = e^{−x²}/(x√π) · (1 − 1/(2x²) + 3/(4x⁴) − 15/(8x⁶) + …)
        return -x2 - Foundation.log(x) - 0.5 * Foundation.log(Double.pi) + log1p(-1 / (2 * x2) + 3 / (4 * x2 * x2) - 15 / (8 * x2 * x2 * x2))
    }

    /// ε for `delta` from RDP values at `orders` (the smallest over the orders), with the order that gives it.
    public static func epsilon(rdp: [Double], orders: [Double], delta: Double) -> (epsilon: Double, order: Double) {
        precondition(rdp.count == orders.count, "one RDP value per order")
        var best = (epsilon: Double.infinity, order: orders.first ?? 0)
        for (r, a) in zip(rdp, orders) {
            let candidate: Double
            if r < 0 {
                candidate = 0
            } else if delta * delta + expm1(-r) > 0 {
                candidate = 0
            } else {
                candidate = r + log1p(-1 / a) - log(delta * a) / (a - 1)
            }
            if candidate < best.epsilon { best = (candidate, a) }
        }
        return (max(0, best.epsilon), best.order)
    }

    static func logBinomial(_ n: Int, _ k: Int) -> Double {
        lgamma(Double(n + 1)) - lgamma(Double(k + 1)) - lgamma(Double(n - k + 1))
    }

    static func logAdd(_ a: Double, _ b: Double) -> Double {
        if a == -.infinity { return b }
        if b == -.infinity { return a }
        let high = max(a, b), low = min(a, b)
        return high + log1p(exp(low - high))
    }
}

/// What a process has spent: the RDP of every step so far at each order, composed by addition. A value type,
/// stored with each checkpoint.
public struct PrivacyAccountant: Sendable, Hashable, Codable {
    /// The orders tracked.
    public private(set) var orders: [Double]
    /// The composed RDP at each order.
    public private(set) var rdp: [Double]
    /// Steps (cycles) composed.
    public private(set) var steps: Int

    enum CodingKeys: String, CodingKey { case orders, rdp, steps }

    /// An accountant that has spent nothing.
    public init(orders: [Double] = RenyiDP.defaultOrders) {
        self.orders = orders
        rdp = [Double](repeating: 0, count: orders.count)
        steps = 0
    }

    /// Composes `steps` steps of the subsampled Gaussian mechanism.
    /// - Throws: `invalid_parameter` for a sampling rate outside 0…1, a negative or non-finite noise multiplier, or
    ///   a negative step count.
    public mutating func spend(samplingRate q: Double, noiseMultiplier z: Double, steps count: Int = 1) throws(PrivacyError) {
        try Self.check(samplingRate: q, noiseMultiplier: z, steps: count)
        guard count > 0 else { return }
        for index in orders.indices {
            rdp[index] += Double(count) * RenyiDP.stepRDP(samplingRate: q, noiseMultiplier: z, order: orders[index])
        }
        steps += count
    }

    /// ε spent at `delta`.
    /// - Throws: `invalid_parameter` unless 0 < δ < 1.
    public func epsilon(delta: Double) throws(PrivacyError) -> Double {
        try Self.check(delta: delta)
        return RenyiDP.epsilon(rdp: rdp, orders: orders, delta: delta).epsilon
    }

    /// ε after `steps` steps at rate `q` and noise multiplier `z`, at `delta`, with the optimal order.
    public static func epsilon(samplingRate q: Double, noiseMultiplier z: Double, steps: Int, delta: Double, orders: [Double] = RenyiDP.defaultOrders)
        throws(PrivacyError) -> (epsilon: Double, order: Double)
    {
        try check(samplingRate: q, noiseMultiplier: z, steps: steps)
        try check(delta: delta)
        if steps == 0 { return (0, orders.first ?? 0) }
        let rdp = orders.map { Double(steps) * RenyiDP.stepRDP(samplingRate: q, noiseMultiplier: z, order: $0) }
        return RenyiDP.epsilon(rdp: rdp, orders: orders, delta: delta)
    }

    /// The smallest noise multiplier (to 0.1 % relative) with which `steps` steps at rate `q` spend at most
    /// `targetEpsilon` at `delta`.
    /// - Throws: `invalid_parameter` for inputs out of range; `unreachable_target` if even a multiplier of 10⁴ spends more.
    public static func noiseMultiplier(samplingRate q: Double, steps: Int, delta: Double, targetEpsilon: Double, orders: [Double] = RenyiDP.defaultOrders)
        throws(PrivacyError) -> Double
    {
        try check(samplingRate: q, noiseMultiplier: 1, steps: steps)
        try check(delta: delta)
        guard targetEpsilon > 0, targetEpsilon.isFinite else {
            throw PrivacyError(.invalidParameter, "target epsilon must be a positive number, not \(targetEpsilon)")
        }
        func spent(_ z: Double) throws(PrivacyError) -> Double {
            try epsilon(samplingRate: q, noiseMultiplier: z, steps: steps, delta: delta, orders: orders).epsilon
        }
        var high = 1.0
        while try spent(high) > targetEpsilon {
            guard high < 1e4 else {
                throw PrivacyError(.unreachableTarget, "no noise multiplier up to 10^4 keeps epsilon at or below \(targetEpsilon)")
            }
            high = min(high * 2, 1e4)
        }
        var low = 0.0
        while high - low > 1e-3 * high {
            let middle = (low + high) / 2
            if try spent(middle) > targetEpsilon { low = middle } else { high = middle }
        }
        return high
    }

    static func check(samplingRate q: Double, noiseMultiplier z: Double, steps: Int) throws(PrivacyError) {
        guard q >= 0, q <= 1 else { throw PrivacyError(.invalidParameter, "sampling rate must be in 0...1, not \(q)") }
        guard z >= 0, z.isFinite else { throw PrivacyError(.invalidParameter, "noise multiplier must be a finite number >= 0, not \(z)") }
        guard steps >= 0 else { throw PrivacyError(.invalidParameter, "steps must be >= 0, not \(steps)") }
    }

    static func check(delta: Double) throws(PrivacyError) {
        guard delta > 0, delta < 1 else { throw PrivacyError(.invalidParameter, "delta must be in (0, 1), not \(delta)") }
    }
}
