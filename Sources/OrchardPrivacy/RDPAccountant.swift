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
/// Zhang 2019), at integer orders, and its conversion to (ε, δ) by the bound of Balle et al. 2020 (Prop. 12) —
/// the computation of Google's `dp-accounting` and Opacus at the same orders.
public enum RenyiDP {
    /// The orders tracked: 2…64, then 80, 96, 128, 256, 512 and 1024.
    public static let defaultOrders: [Int] = Array(2...64) + [80, 96, 128, 256, 512, 1024]

    /// The RDP at order `alpha` of one step of the Gaussian mechanism with noise multiplier `z` (σ / sensitivity)
    /// on a Poisson sample of rate `q`: log(A_α) / (α − 1) with A_α = Σₖ C(α,k) (1−q)^{α−k} qᵏ exp((k²−k) / 2z²).
    public static func stepRDP(samplingRate q: Double, noiseMultiplier z: Double, order alpha: Int) -> Double {
        precondition(alpha >= 2, "orders start at 2")
        if q == 0 { return 0 }
        if z == 0 { return .infinity }
        if q == 1 { return Double(alpha) / (2 * z * z) }
        let logQ = log(q), log1mQ = log1p(-q)
        var logA = -Double.infinity
        for k in 0...alpha {
            let term = logBinomial(alpha, k) + Double(k) * logQ + Double(alpha - k) * log1mQ + Double(k * k - k) / (2 * z * z)
            logA = logAdd(logA, term)
        }
        return logA / Double(alpha - 1)
    }

    /// ε for `delta` from RDP values at `orders` (the smallest over the orders), with the order that gives it.
    public static func epsilon(rdp: [Double], orders: [Int], delta: Double) -> (epsilon: Double, order: Int) {
        precondition(rdp.count == orders.count, "one RDP value per order")
        var best = (epsilon: Double.infinity, order: orders.first ?? 0)
        for (r, order) in zip(rdp, orders) {
            let a = Double(order)
            let candidate: Double
            if r < 0 {
                candidate = 0
            } else if delta * delta + expm1(-r) > 0 {
                candidate = 0
            } else {
                candidate = r + log1p(-1 / a) - log(delta * a) / (a - 1)
            }
            if candidate < best.epsilon { best = (candidate, order) }
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
    public private(set) var orders: [Int]
    /// The composed RDP at each order.
    public private(set) var rdp: [Double]
    /// Steps (cycles) composed.
    public private(set) var steps: Int

    enum CodingKeys: String, CodingKey { case orders, rdp, steps }

    /// An accountant that has spent nothing.
    public init(orders: [Int] = RenyiDP.defaultOrders) {
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
    public static func epsilon(samplingRate q: Double, noiseMultiplier z: Double, steps: Int, delta: Double, orders: [Int] = RenyiDP.defaultOrders) throws(PrivacyError) -> (epsilon: Double, order: Int) {
        try check(samplingRate: q, noiseMultiplier: z, steps: steps)
        try check(delta: delta)
        if steps == 0 { return (0, orders.first ?? 0) }
        let rdp = orders.map { Double(steps) * RenyiDP.stepRDP(samplingRate: q, noiseMultiplier: z, order: $0) }
        return RenyiDP.epsilon(rdp: rdp, orders: orders, delta: delta)
    }

    /// The smallest noise multiplier (to 0.1 % relative) with which `steps` steps at rate `q` spend at most
    /// `targetEpsilon` at `delta`.
    /// - Throws: `invalid_parameter` for inputs out of range; `unreachable_target` if even a multiplier of 10⁴ spends more.
    public static func noiseMultiplier(samplingRate q: Double, steps: Int, delta: Double, targetEpsilon: Double, orders: [Int] = RenyiDP.defaultOrders) throws(PrivacyError) -> Double {
        try check(samplingRate: q, noiseMultiplier: 1, steps: steps)
        try check(delta: delta)
        guard targetEpsilon > 0, targetEpsilon.isFinite else {
            throw PrivacyError(.invalidParameter, "target epsilon must be a positive number, not \(targetEpsilon)")
        }
        func spent(_ z: Double) throws(PrivacyError) -> Double { try epsilon(samplingRate: q, noiseMultiplier: z, steps: steps, delta: delta, orders: orders).epsilon }
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
