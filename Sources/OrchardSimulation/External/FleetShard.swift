import Foundation
import OrchardSupport
import OrchardClient
import OrchardHTTPClient
import OrchardOperator
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import Logging
import Synchronization

/// One slice of a fleet: shard `index` of `count` (1-based, as in `--shard 2/3`) holds the devices whose global
/// index d has d % count == index − 1. Every shard deals the data with the same seed, so device d has the same
/// slice whichever machine runs it.
public struct FleetShard: Sendable, Hashable, CustomStringConvertible {
    /// The shard's number, 1…``count``.
    public let index: Int
    /// How many shards the fleet is cut into.
    public let count: Int

    /// The whole fleet (shard 1 of 1).
    public static let whole = FleetShard(checked: 1, count: 1)

    private init(checked index: Int, count: Int) {
        self.index = index
        self.count = count
    }

    /// Shard `index` of `count`.
    /// - Throws: ``SimulationError/Code/invalidOption`` unless 1 ≤ index ≤ count.
    public init(index: Int, count: Int) throws(SimulationError) {
        guard count >= 1 else { throw SimulationError(.invalidOption, "shard \(index)/\(count): the number of shards must be at least 1") }
        guard (1...count).contains(index) else {
            throw SimulationError(.invalidOption, "shard \(index)/\(count): the shard number must be in 1…\(count) (shards are numbered from 1)")
        }
        self.init(checked: index, count: count)
    }

    /// Parses `i/n`, e.g. `2/3` (the second of three shards).
    public init(parsing text: String) throws(SimulationError) {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, let index = Int(parts[0]), let count = Int(parts[1]) else {
            throw SimulationError(.invalidOption, "shard must be i/n with whole numbers 1 ≤ i ≤ n, such as 2/3, not '\(text)'")
        }
        try self.init(index: index, count: count)
    }

    /// Whether global device `device` belongs to this shard.
    public func contains(device: Int) -> Bool { device % count == index - 1 }

    /// This shard's devices in a fleet of `fleet`, ascending.
    public func devices(of fleet: Int) -> [Int] { Array(stride(from: index - 1, to: fleet, by: count)) }

    /// `i/n`.
    public var description: String { "\(index)/\(count)" }
}
