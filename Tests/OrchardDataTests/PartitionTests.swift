import OrchardSupport
import OrchardData
import OrchardML
import Testing

@Suite("Federated partitions")
struct PartitionTests {
    /// 600 samples, labels 0…9, 60 of each, in a scrambled order.
    static let labels: [Int] = (0..<600).map { ($0 * 7) % 10 }

    static let strategies: [PartitionStrategy] = [
        .iid, .labelShards(), .labelShards(perClient: 3), .dirichlet(alpha: 0.1), .dirichlet(alpha: 100), .skewedQuantity(beta: 0.5),
    ]

    @Test("every sample goes to exactly one client", arguments: strategies)
    func everySampleOnce(strategy: PartitionStrategy) throws {
        var g = OrchardRandom(seed: 42)
        let parts = try strategy.assign(count: 600, labels: Self.labels, clients: 20, using: &g)
        #expect(parts.count == 20)
        #expect(parts.flatMap { $0 }.sorted() == Array(0..<600))
        #expect(parts.allSatisfy { !$0.isEmpty })
    }

    @Test("the same seed gives the same partition, another seed another", arguments: strategies)
    func reproducible(strategy: PartitionStrategy) throws {
        var a = OrchardRandom(seed: 3)
        var b = OrchardRandom(seed: 3)
        var c = OrchardRandom(seed: 4)
        let first = try strategy.assign(count: 600, labels: Self.labels, clients: 20, using: &a)
        #expect(try strategy.assign(count: 600, labels: Self.labels, clients: 20, using: &b) == first)
        #expect(try strategy.assign(count: 600, labels: Self.labels, clients: 20, using: &c) != first)
    }

    @Test("IID parts differ in size by at most one")
    func iidSizes() throws {
        var g = OrchardRandom(seed: 1)
        let sizes = try PartitionStrategy.iid.assign(count: 603, clients: 20, using: &g).map(\.count)
        #expect(sizes.max()! - sizes.min()! <= 1)
    }

    @Test("label-shard clients hold at most two labels, in two equal shards")
    func labelShards() throws {
        var g = OrchardRandom(seed: 9)
        // 600 samples, 30 clients × 2 shards of 10; every label's 60 samples fill exactly 6 shards.
        let parts = try PartitionStrategy.labelShards().assign(count: 600, labels: Self.labels, clients: 30, using: &g)
        for part in parts {
            #expect(part.count == 20)
            #expect(Set(part.map { Self.labels[$0] }).count <= 2)
        }
        // And the split is not trivially one label per client everywhere.
        #expect(parts.contains { Set($0.map { Self.labels[$0] }).count == 2 })
    }

    @Test("small Dirichlet α concentrates labels; large α spreads them")
    func dirichletConcentration() throws {
        func meanLabels(alpha: Double) throws -> Double {
            var g = OrchardRandom(seed: 5)
            let parts = try PartitionStrategy.dirichlet(alpha: alpha).assign(count: 600, labels: Self.labels, clients: 10, using: &g)
            return Double(parts.map { Set($0.map { Self.labels[$0] }).count }.reduce(0, +)) / 10
        }
        let skewed = try meanLabels(alpha: 0.05)
        let even = try meanLabels(alpha: 1000)
        #expect(even == 10)
        #expect(skewed < 5)
    }

    @Test("skewed quantity gives unequal client sizes")
    func skewedQuantity() throws {
        var g = OrchardRandom(seed: 11)
        let sizes = try PartitionStrategy.skewedQuantity(beta: 0.3).assign(count: 600, clients: 10, using: &g).map(\.count)
        #expect(sizes.max()! > 3 * sizes.min()!)
        #expect(sizes.allSatisfy { $0 >= 1 })
    }

    @Test("sampled clients each draw N distinct samples, uniformly, more clients than samples allowed")
    func sampled() throws {
        var g = OrchardRandom(seed: 9)
        let parts = try PartitionStrategy.sampled(perClient: 4).assign(count: 10, clients: 5000, using: &g)
        #expect(parts.count == 5000)
        #expect(parts.allSatisfy { $0.count == 4 && Set($0).count == 4 && $0.allSatisfy { (0..<10).contains($0) } })
        // Each sample is held by about 4/10 of the clients: binomial, 2000 with a standard deviation of 35.
        var holders = [Int](repeating: 0, count: 10)
        for part in parts { for i in part { holders[i] += 1 } }
        #expect(holders.allSatisfy { abs($0 - 2000) < 175 })
        var again = OrchardRandom(seed: 9)
        #expect(try PartitionStrategy.sampled(perClient: 4).assign(count: 10, clients: 5000, using: &again) == parts)
        #expect(throws: DataError.self) { try PartitionStrategy.sampled(perClient: 11).assign(count: 10, clients: 2, using: &g) }
        #expect(throws: DataError.self) { try PartitionStrategy.sampled(perClient: 0).assign(count: 10, clients: 2, using: &g) }
        // A population that would not fit in memory is refused before anything is allocated, overflow included.
        #expect(throws: DataError.self) { try PartitionStrategy.sampled(perClient: 10).assign(count: 10, clients: 1 << 28, using: &g) }
        #expect(throws: DataError.self) { try PartitionStrategy.sampled(perClient: 10).assign(count: 10, clients: Int.max / 2, using: &g) }
    }

    @Test("invalid requests are rejected")
    func invalid() {
        var g = OrchardRandom(seed: 1)
        #expect(throws: DataError.self) { try PartitionStrategy.iid.assign(count: 5, clients: 6, using: &g) }
        #expect(throws: DataError.self) { try PartitionStrategy.iid.assign(count: 5, clients: 0, using: &g) }
        #expect(throws: DataError.self) { try PartitionStrategy.labelShards().assign(count: 5, clients: 2, using: &g) }
        #expect(throws: DataError.self) { try PartitionStrategy.dirichlet(alpha: 0).assign(count: 5, labels: [0, 0, 1, 1, 1], clients: 2, using: &g) }
        #expect(throws: DataError.self) { try PartitionStrategy.dirichlet(alpha: 1).assign(count: 5, labels: [0, 1], clients: 2, using: &g) }
        #expect(throws: DataError.self) {
            try PartitionStrategy.skewedQuantity(beta: 1, minimumClientSize: 3).assign(count: 5, clients: 2, using: &g)
        }
    }

    @Test("client partitions are views that read the base dataset's samples")
    func slicesAreViews() throws {
        let values = (0..<12).map(Float.init)
        let base = try TensorDataset(
            inputs: ["x": Tensor(shape: [6, 2], scalars: values)], targets: Tensor(shape: [6, 1], scalars: [0, 1, 2, 0, 1, 2]))
        var g = OrchardRandom(seed: 2)
        let clients = try base.partitioned(into: 3, strategy: .labelShards(perClient: 1), using: &g)
        #expect(clients.map(\.count) == [2, 2, 2])
        for client in clients {
            for (i, original) in client.indices.enumerated() {
                #expect(read(client, input: 0, sample: i) == [Float(2 * original), Float(2 * original + 1)])
                #expect(readTarget(client, sample: i) == readTarget(base, sample: original))
            }
            // One shard of a sorted-by-label order: a single label per client.
            #expect(Set(client.indices.map { readTarget(base, sample: $0)[0] }).count == 1)
        }
    }

    @Test("labels for label-based partitions must be class indices")
    func nonIntegerLabels() throws {
        let base = try TensorDataset(inputs: [:], targets: Tensor(shape: [4, 1], scalars: [0.5, 1, 2, 3]))
        var g = OrchardRandom(seed: 2)
        #expect { try base.partitioned(into: 2, strategy: .dirichlet(alpha: 1), using: &g) } throws: {
            ($0 as? DataError)?.code == .malformedValue
        }
        // An explicit labelling (e.g. price bands for a regression target) is accepted instead.
        let parts = try base.partitioned(into: 2, strategy: .labelShards(perClient: 1), using: &g, labels: [0, 0, 1, 1])
        #expect(parts.map { $0.indices.sorted() }.sorted { $0[0] < $1[0] } == [[0, 1], [2, 3]])
    }
}

@Suite("Permutations")
struct PermutationTests {
    @Test("a permutation holds every index once, and each position is uniform")
    func permutation() {
        var g = OrchardRandom(seed: 4)
        var firstPosition = [Int](repeating: 0, count: 5)
        for _ in 0..<5000 {
            let p = g.permutation(5)
            #expect(p.sorted() == [0, 1, 2, 3, 4])
            firstPosition[p[0]] += 1
        }
        #expect(firstPosition.allSatisfy { $0 > 850 && $0 < 1150 })
    }
}
