import Foundation
import OrchardPrivacy
import OrchardSupport

/// The simulation's stand-in for a device-attestation service, for secure aggregation with `consistency_check`: one
/// authority derived from the simulation's seed certifies every virtual device's identity, and every device trusts
/// only it (as an app ships its authority's public key). Shards of an external run derive the same authority.
enum SimulatedAttestation {
    /// When the simulated certificates expire (far beyond any simulated time).
    static let expiry = Date(timeIntervalSince1970: 4_000_000_000)

    /// The authority of a simulation seeded `seed`.
    static func authority(seed: UInt64) -> SecureAggregationAuthority {
        var generator = OrchardRandom.derived(seed: seed ^ 0xA77E_5000, stream: 0)
        return SecureAggregationAuthority(using: &generator)
    }

    /// Device `device`'s certified identity and the authorities it trusts.
    static func credentials(seed: UInt64, device: Int) throws(SimulationError) -> (identity: SecureAggregationIdentity, authorities: [Data]) {
        let authority = authority(seed: seed)
        var generator = OrchardRandom.derived(seed: seed ^ 0xA77E_5000, stream: UInt64(device) + 1)
        do {
            let identity = try SecureAggregationIdentity(authority: authority, subject: "device-\(device)", expiresAt: expiry, using: &generator)
            return (identity, [authority.publicKey])
        } catch {
            throw SimulationError(.training, "device \(device)'s simulated identity cannot be made: \(error.message)")
        }
    }
}
