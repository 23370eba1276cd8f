public import OrchardSupport
import Foundation
public import OrchardML

/// How samples are dealt out to federated clients.
///
/// Every strategy but ``sampled(perClient:)`` assigns each sample to exactly one client; all are reproducible from
/// their generator's seed.
public struct PartitionStrategy: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: Sendable, Hashable {
        case iid
        case labelShards(shardsPerClient: Int)
        case dirichlet(alpha: Double, minimumClientSize: Int)
        case skewedQuantity(beta: Double, minimumClientSize: Int)
        case sampled(perClient: Int)
    }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// A uniform random permutation cut into near-equal parts (sizes differ by at most one).
    public static let iid = PartitionStrategy(.iid)

    /// McMahan et al. 2017's pathological non-IID split: sort samples by label, cut them into
    /// `clients × shardsPerClient` equal shards, and give each client `shardsPerClient` shards at random.
    /// A client holds at most `shardsPerClient` labels when every label's count is a multiple of the shard size
    /// (as in MNIST's 60 000 samples, 100 clients, 2 shards of 300); otherwise a shard may straddle two labels.
    public static func labelShards(perClient shardsPerClient: Int = 2) -> PartitionStrategy {
        PartitionStrategy(.labelShards(shardsPerClient: shardsPerClient))
    }

    /// Label skew (Hsu et al. 2019): for each label, client shares are drawn from Dirichlet(α, …, α) and that
    /// label's samples are cut accordingly. Small α (0.1) gives clients few labels; large α (100) is close to IID.
    /// The whole draw is repeated (up to 1000 times) until every client has `minimumClientSize` samples.
    public static func dirichlet(alpha: Double, minimumClientSize: Int = 1) -> PartitionStrategy {
        PartitionStrategy(.dirichlet(alpha: alpha, minimumClientSize: minimumClientSize))
    }

    /// Quantity skew (Li et al. 2022): client sizes are proportional to a Dirichlet(β) draw; which samples a
    /// client gets is uniformly random, so label mixes stay IID. The draw is repeated (up to 1000 times) until
    /// every client has `minimumClientSize` samples.
    public static func skewedQuantity(beta: Double = 0.5, minimumClientSize: Int = 1) -> PartitionStrategy {
        PartitionStrategy(.skewedQuantity(beta: beta, minimumClientSize: minimumClientSize))
    }

    /// A population larger than the dataset (cross-device simulations of 10⁵ devices): each client holds `perClient`
    /// distinct samples drawn uniformly at random, independently of the other clients, so clients' data overlap.
    public static func sampled(perClient: Int) -> PartitionStrategy { PartitionStrategy(.sampled(perClient: perClient)) }

    /// Most sample indices ``sampled(perClient:)`` deals out in all (2²⁸, 2 GiB of indices).
    public static let maximumSampledDraws = 1 << 28

    /// Whether the strategy needs each sample's label.
    public var needsLabels: Bool {
        switch kind {
        case .labelShards, .dirichlet: true
        case .iid, .skewedQuantity, .sampled: false
        }
    }

    public var description: String {
        switch kind {
        case .iid: "iid"
        case .labelShards(let k): "label-shards(\(k) per client)"
        case .dirichlet(let alpha, _): "dirichlet(α=\(alpha))"
        case .skewedQuantity(let beta, _): "skewed-quantity(β=\(beta))"
        case .sampled(let perClient): "sampled(\(perClient) per client)"
        }
    }

    /// Deals positions `0..<count` out to `clients` clients.
    /// - Parameters:
    ///   - count: Number of samples.
    ///   - labels: Each sample's class label (required by label-based strategies; `count` of them).
    ///   - clients: Number of clients, at least 1 and at most `count` (any number for ``sampled(perClient:)``).
    ///   - generator: The seeded source of randomness.
    /// - Returns: Each client's sample positions; together they hold every position exactly once (but for
    ///   ``sampled(perClient:)``).
    public func assign(count: Int, labels: [Int]? = nil, clients: Int, using generator: inout OrchardRandom) throws(DataError) -> [[Int]] {
        guard clients >= 1 else { throw DataError(.invalidArgument, "need at least one client, not \(clients)") }
        if case .sampled = kind {
        } else if count < clients {
            throw DataError(.tooFewSamples, "\(count) samples cannot be dealt to \(clients) clients")
        }
        if let labels, labels.count != count {
            throw DataError(.sizeMismatch, "\(labels.count) labels for \(count) samples")
        }
        switch kind {
        case .sampled(let perClient):
            guard perClient >= 1 && perClient <= count else {
                throw DataError(.invalidArgument, "each client must draw between 1 and \(count) samples, not \(perClient)")
            }
            let (draws, overflow) = clients.multipliedReportingOverflow(by: perClient)
            guard !overflow && draws <= Self.maximumSampledDraws else {
                throw DataError(
                    .invalidArgument,
                    "\(clients) clients drawing \(perClient) samples each hold more than \(Self.maximumSampledDraws) sample indices; draw fewer per client")
            }
            // A partial Fisher–Yates shuffle per client: its first `perClient` positions are a uniform draw whatever the
            // order the previous clients left.
            var scratch = Array(0..<count)
            return (0..<clients).map { _ in
                (0..<perClient).map { i in
                    scratch.swapAt(i, i + generator.nextInt(below: count - i))
                    return scratch[i]
                }
            }

        case .iid:
            let order = generator.permutation(count)
            return (0..<clients).map { c in Array(order[(c * count / clients)..<((c + 1) * count / clients)]) }

        case .labelShards(let perClient):
            let labels = try require(labels)
            guard perClient >= 1 else { throw DataError(.invalidArgument, "shards per client must be at least 1, not \(perClient)") }
            let shards = clients * perClient
            guard count >= shards else {
                throw DataError(.tooFewSamples, "\(count) samples cannot be cut into \(shards) shards")
            }
            // Random order within each label, then a sort by label: shards are contiguous runs of one label.
            let rank = generator.permutation(count)
            let order = (0..<count).sorted { (labels[$0], rank[$0]) < (labels[$1], rank[$1]) }
            let dealt = generator.permutation(shards)
            return (0..<clients).map { c in
                dealt[(c * perClient)..<((c + 1) * perClient)].flatMap { s in order[(s * count / shards)..<((s + 1) * count / shards)] }
            }

        case .dirichlet(let alpha, let minimum):
            let labels = try require(labels)
            guard alpha > 0, alpha.isFinite else { throw DataError(.invalidArgument, "Dirichlet α must be positive, not \(alpha)") }
            var byLabel: [Int: [Int]] = [:]
            for (i, label) in labels.enumerated() { byLabel[label, default: []].append(i) }
            let classes = byLabel.keys.sorted()
            return try redraw(minimum: minimum, clients: clients, count: count) { () -> [[Int]] in
                var parts = [[Int]](repeating: [], count: clients)
                for label in classes {
                    var members = byLabel[label]!
                    generator.shuffle(&members)
                    let shares = generator.dirichlet(alpha: alpha, count: clients)
                    for (c, range) in cut(members.count, by: shares).enumerated() { parts[c] += members[range] }
                }
                return parts
            }

        case .skewedQuantity(let beta, let minimum):
            guard beta > 0, beta.isFinite else { throw DataError(.invalidArgument, "Dirichlet β must be positive, not \(beta)") }
            return try redraw(minimum: minimum, clients: clients, count: count) { () -> [[Int]] in
                let order = generator.permutation(count)
                let shares = generator.dirichlet(alpha: beta, count: clients)
                return cut(count, by: shares).map { Array(order[$0]) }
            }
        }
    }

    private func require(_ labels: [Int]?) throws(DataError) -> [Int] {
        guard let labels else { throw DataError(.invalidArgument, "the \(self) partition needs each sample's label") }
        return labels
    }

    private func redraw(minimum: Int, clients: Int, count: Int, _ draw: () -> [[Int]]) throws(DataError) -> [[Int]] {
        guard minimum >= 0, minimum * clients <= count else {
            throw DataError(.invalidArgument, "a minimum of \(minimum) samples for \(clients) clients needs more than \(count) samples")
        }
        for _ in 0..<1000 {
            let parts = draw()
            if parts.allSatisfy({ $0.count >= minimum }) { return parts }
        }
        throw DataError(
            .tooFewSamples, "1000 draws of \(self) all left a client with fewer than \(minimum) samples; raise the concentration or lower the minimum")
    }
}

/// Cuts `0..<count` into consecutive ranges proportional to `shares` (which sum to 1).
private func cut(_ count: Int, by shares: [Double]) -> [Range<Int>] {
    var ranges: [Range<Int>] = []
    var cumulative = 0.0
    var start = 0
    for (c, share) in shares.enumerated() {
        cumulative += share
        let end = c == shares.count - 1 ? count : min(count, max(start, Int((cumulative * Double(count)).rounded())))
        ranges.append(start..<end)
        start = end
    }
    return ranges
}

extension OrchardRandom {
    /// A draw from the symmetric Dirichlet(α, …, α) distribution over `count` categories.
    ///
    /// Gamma variates are drawn in log space (Marsaglia & Tsang 2000, with the `U^(1/α)` boost for α < 1) and
    /// normalised with log-sum-exp, so very small α does not underflow to all-zero shares.
    mutating func dirichlet(alpha: Double, count: Int) -> [Double] {
        let logs = (0..<count).map { _ in logGamma(shape: alpha) }
        let top = logs.max()!
        let weights = logs.map { exp($0 - top) }
        let total = weights.reduce(0, +)
        return weights.map { $0 / total }
    }

    /// The logarithm of a Gamma(shape, 1) variate.
    mutating func logGamma(shape: Double) -> Double {
        if shape < 1 {
            var u = nextDouble()
            while u == 0 { u = nextDouble() }
            return logGamma(shape: shape + 1) + log(u) / shape
        }
        let d = shape - 1.0 / 3
        let c = 1 / (9 * d).squareRoot()
        while true {
            let x = nextStandardNormalSample()
            let v = 1 + c * x
            guard v > 0 else { continue }
            let v3 = v * v * v
            let u = nextDouble()
            if u < 1 - 0.0331 * x * x * x * x || (u > 0 && log(u) < 0.5 * x * x + d * (1 - v3 + log(v3))) {
                return log(d) + log(v3)
            }
        }
    }
}

extension Dataset {
    /// Deals the samples out to federated clients; each client's part is a view, not a copy.
    /// - Parameters:
    ///   - clients: Number of clients.
    ///   - strategy: How samples are dealt out.
    ///   - generator: The seeded source of randomness.
    ///   - labels: Each sample's label, for label-based strategies; read from the target (a class index) when nil.
    public func partitioned(
        into clients: Int, strategy: PartitionStrategy, using generator: inout OrchardRandom, labels: [Int]? = nil
    ) throws(DataError) -> [DatasetSlice<Self>] {
        var labels = labels
        if strategy.needsLabels && labels == nil { labels = try classLabels() }
        return try strategy.assign(count: count, labels: labels, clients: clients, using: &generator).map { slice($0) }
    }
}
