public import Foundation
import Crypto

/// Who shares secrets with whom in a cycle: every other participant (SecAgg), or — SecAgg+ (Bell et al. 2020) —
/// `shares` neighbours on a ring: the participants ordered by SHA-256(seed ‖ index) (a permutation fixed by the
/// public per-cycle seed) and each joined to the shares/2 nearest on either side. The relation is symmetric.
/// When `shares` is nil or at least participants − 1, everyone neighbours everyone.
public struct NeighbourGraph: Sendable, Hashable, Codable {
    /// The participants, ascending.
    public let participants: [Int]
    /// The requested neighbour count (nil: all).
    public let shares: Int?
    /// The public seed of the permutation.
    public let seed: Data
    /// The participants in ring order.
    public let ring: [Int]
    let position: [Int: Int]

    enum CodingKeys: String, CodingKey { case participants, shares, seed }

    /// The graph of `participants` (distinct indices) for `shares` neighbours each, from the cycle's `seed`.
    public init(participants: [Int], shares: Int?, seed: Data) {
        self.participants = Array(Set(participants)).sorted()
        self.shares = shares
        self.seed = seed
        let keyed = self.participants.map { index -> (UInt64, Int) in
            var input = seed
            input.appendLittleEndian(UInt64(bitPattern: Int64(index)))
            let digest = Array(SHA256.hash(data: input))
            return ((0..<8).reduce(UInt64(0)) { $0 | UInt64(digest[$1]) << (8 * UInt64($1)) }, index)
        }
        ring = keyed.sorted { $0 < $1 }.map(\.1)
        position = Dictionary(uniqueKeysWithValues: ring.enumerated().map { ($1, $0) })
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            participants: try container.decode([Int].self, forKey: .participants),
            shares: try container.decodeIfPresent(Int.self, forKey: .shares),
            seed: try container.decode(Data.self, forKey: .seed))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(participants, forKey: .participants)
        try container.encodeIfPresent(shares, forKey: .shares)
        try container.encode(seed, forKey: .seed)
    }

    /// True when everyone neighbours everyone.
    public var isComplete: Bool { shares.map { $0 >= participants.count - 1 } ?? true }

    /// Whether `device` is a participant.
    public func contains(_ device: Int) -> Bool { position[device] != nil }

    /// The neighbours of `device`, ascending (empty for a non-participant).
    public func neighbours(of device: Int) -> [Int] {
        guard let p = position[device] else { return [] }
        if isComplete { return participants.filter { $0 != device } }
        let n = ring.count, half = (shares ?? 0) / 2
        var result = Set<Int>()
        for d in 1...max(half, 1) where d <= half {
            result.insert(ring[(p + d) % n])
            result.insert(ring[(p - d + n) % n])
        }
        return result.sorted()
    }
}
