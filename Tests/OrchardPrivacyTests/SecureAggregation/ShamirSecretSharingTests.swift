import Foundation
import OrchardPrivacy
import OrchardSupport
import Testing

/// Shamir t-of-n sharing over GF(2^61 − 1).
@Suite struct SecureAggregationShamirTests {
    static func secret(_ seed: UInt64) -> [UInt8] {
        var generator = SplitMix64(seed: seed)
        return (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
    }

    @Test(arguments: [(2, 3), (3, 5), (5, 9), (7, 12)])
    func anyThresholdSubsetReconstructs(threshold: Int, count: Int) throws {
        var generator = SplitMix64(seed: UInt64(threshold * 100 + count))
        let secret = Self.secret(UInt64(count))
        let indices = (1...count).map { $0 * 3 + 1 }  // not 1…n: indices are device indices
        let shares = try ShamirSecretSharing.split(secret, threshold: threshold, indices: indices, using: &generator)
        #expect(shares.map(\.index) == indices)
        #expect(shares.allSatisfy { $0.values.count == 5 })
        for trial in 0..<20 {
            var order = shares
            var shuffler = OrchardRandom(seed: UInt64(trial))
            shuffler.shuffle(&order)
            let subset = Array(order.prefix(threshold + trial % (count - threshold + 1)))
            #expect(try ShamirSecretSharing.reconstruct(subset, threshold: threshold, byteCount: 32) == secret)
        }
    }

    /// With t − 1 shares, interpolating as though the threshold were t − 1 never gives the secret.
    @Test func oneShareTooFewDoesNotReconstruct() throws {
        var generator = SplitMix64(seed: 9)
        let secret = Self.secret(4)
        var wrong = 0
        for trial in 0..<50 {
            let shares = try ShamirSecretSharing.split(secret, threshold: 4, indices: Array(1...6), using: &generator)
            let subset = Array(shares.shuffled(using: &generator).prefix(3))
            do {
                let guess = try ShamirSecretSharing.reconstruct(subset, threshold: 3, byteCount: 32)
                if guess != secret { wrong += 1 }
            } catch {
                #expect(error.code == .reconstructionFailed, "trial \(trial)")
                wrong += 1
            }
        }
        #expect(wrong == 50)
        // And with the true threshold, too few shares are refused outright.
        let shares = try ShamirSecretSharing.split(secret, threshold: 4, indices: Array(1...6), using: &generator)
        #expect(throws: SecureAggregationError.self) { try ShamirSecretSharing.reconstruct(Array(shares.prefix(3)), threshold: 4, byteCount: 32) }
    }

    @Test func badIndicesAreRejected() throws {
        var generator = SplitMix64(seed: 1)
        let secret = Self.secret(1)
        for indices in [[0, 1, 2], [1, 2, 2], [-3, 1, 2]] {
            let error = #expect(throws: SecureAggregationError.self) {
                try ShamirSecretSharing.split(secret, threshold: 2, indices: indices, using: &generator)
            }
            #expect(error?.code == .invalidShare)
        }
        #expect(throws: SecureAggregationError.self) { try ShamirSecretSharing.split(secret, threshold: 4, indices: [1, 2, 3], using: &generator) }
        let shares = try ShamirSecretSharing.split(secret, threshold: 2, indices: [1, 2, 3], using: &generator)
        let duplicate = [shares[0], ShamirShare(index: 1, values: shares[1].values)]
        let error = #expect(throws: SecureAggregationError.self) { try ShamirSecretSharing.reconstruct(duplicate, threshold: 2, byteCount: 32) }
        #expect(error?.code == .invalidShare)
        let outOfField = [shares[0], ShamirShare(index: 2, values: [UInt64](repeating: .max, count: 5))]
        #expect(throws: SecureAggregationError.self) { try ShamirSecretSharing.reconstruct(outOfField, threshold: 2, byteCount: 32) }
    }

    @Test func sharesRoundTripThroughJSON() throws {
        var generator = SplitMix64(seed: 2)
        let shares = try ShamirSecretSharing.split(Self.secret(2), threshold: 2, indices: [4, 9], using: &generator)
        let data = try JSONEncoder().encode(shares[1])
        let json = try #require(String(data: data, encoding: .utf8))
        #expect(json.contains("\"index\":9") && json.contains("\"data\":\""))
        #expect(try JSONDecoder().decode(ShamirShare.self, from: data) == shares[1])
    }
}
