import Crypto
import CryptoExtras
import Foundation
@testable import OrchardPrivacy
import OrchardSupport
import Testing

/// Key agreement, the share channel and mask expansion.
@Suite struct SecureAggregationCryptoTests {
    /// The masks are added chunk by chunk; the words are those of one AES-256-CTR keystream of the whole length,
    /// across chunk boundaries and a partial last chunk (what a device and the server computed before chunking).
    @Test func chunkedExpansionIsOneKeystream() throws {
        let seed = Data((0..<32).map { UInt8(7 &* $0 &+ 1) })
        for count in [1, MaskExpansion.chunkWords - 1, MaskExpansion.chunkWords, MaskExpansion.chunkWords + 1, 3 * MaskExpansion.chunkWords + 7] {
            // The reference: one AES-256-CTR keystream from a zero counter block, made in one call.
            let stream = try AES._CTR.encrypt(
                Data(count: 4 * count), using: SymmetricKey(data: seed), nonce: AES._CTR.Nonce(nonceBytes: [UInt8](repeating: 0, count: 16)))
            let expected = stream.withUnsafeBytes { raw in (0..<count).map { UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 4 * $0, as: UInt32.self)) }
            }
            #expect(try MaskExpansion.expand(seed: seed, count: count, modulusBits: 32) == expected, "\(count) words")
            var words = expected
            try MaskExpansion.apply(seed: seed, to: &words, modulusBits: 32, subtracting: true)
            #expect(words.allSatisfy { $0 == 0 }, "\(count) words: adding then subtracting the mask")
        }
        var empty: [UInt32] = []
        try MaskExpansion.apply(seed: seed, to: &empty, modulusBits: 32, subtracting: false)
        #expect(throws: SecureAggregationError.self) { try MaskExpansion.expand(seed: Data(count: 31), count: 4, modulusBits: 32) }
    }

    /// Several streams applied together (chunk by chunk, eight words at a time) give, word for word, the expansions
    /// added and subtracted one at a time by plain modular arithmetic: lengths that are no multiple of eight, across
    /// chunk boundaries, in a narrow modulus, with a bad seed anywhere refused before any word changes.
    @Test func streamsAppliedTogetherMatchOneAtATime() throws {
        var generator = SplitMix64(seed: 11)
        let streams = (0..<5).map { k in
            MaskExpansion.Stream(seed: SecureAggregationCrypto.randomBytes(32, using: &generator), subtracting: k % 2 == 1)
        }
        for bits in [32, 21] {
            let mask: UInt32 = bits == 32 ? .max : (1 << UInt32(bits)) - 1
            for count in [0, 1, 7, 8, 9, MaskExpansion.chunkWords + 3, 2 * MaskExpansion.chunkWords + 13] {
                let start = (0..<count).map { _ in UInt32(truncatingIfNeeded: generator.next()) & mask }
                var expected = start
                for stream in streams {
                    let words = try MaskExpansion.expand(seed: stream.seed, count: count, modulusBits: 32)
                    for i in 0..<count { expected[i] = (stream.subtracting ? expected[i] &- words[i] : expected[i] &+ words[i]) & mask }
                }
                var together = start
                try MaskExpansion.apply(streams, to: &together, modulusBits: bits)
                #expect(together == expected, "\(count) words modulo 2^\(bits)")
                var sum = start
                ModularWords.add(expected, into: &sum, mask: mask)
                #expect(sum == zip(start, expected).map { ($0 &+ $1) & mask }, "\(count) words added modulo 2^\(bits)")
            }
        }
        var words: [UInt32] = [1, 2, 3]
        #expect(throws: SecureAggregationError.self) {
            try MaskExpansion.apply(streams + [MaskExpansion.Stream(seed: Data(count: 31), subtracting: false)], to: &words, modulusBits: 32)
        }
        #expect(words == [1, 2, 3])
    }

    @Test func maskExpansionIsDeterministicAndSeedDependent() throws {
        let seedA = Data((0..<32).map { UInt8($0) }), seedB = Data((0..<32).map { UInt8($0 == 31 ? 0 : $0) })
        let a1 = try MaskExpansion.expand(seed: seedA, count: 1000, modulusBits: 32)
        let a2 = try MaskExpansion.expand(seed: seedA, count: 1000, modulusBits: 32)
        let b = try MaskExpansion.expand(seed: seedB, count: 1000, modulusBits: 32)
        #expect(a1 == a2)
        #expect(zip(a1, b).filter { $0 == $1 }.count < 3)
        // A prefix of a longer stream; narrower moduli are the low bits.
        #expect(try MaskExpansion.expand(seed: seedA, count: 10, modulusBits: 32) == Array(a1.prefix(10)))
        let narrow = try MaskExpansion.expand(seed: seedA, count: 1000, modulusBits: 20)
        #expect(narrow == a1.map { $0 & 0xFFFFF })
        // Roughly uniform: the mean of 1000 32-bit words is near 2^31.
        let mean = a1.reduce(0.0) { $0 + Double($1) } / 1000
        #expect(abs(mean / 2_147_483_648 - 1) < 0.06)
        #expect(throws: SecureAggregationError.self) { try MaskExpansion.expand(seed: Data(count: 16), count: 4, modulusBits: 32) }
    }

    /// swift-crypto returns the all-zero secret of a low-order public key without complaint; every agreement here (the
    /// share channel, the pairwise masks) refuses it, naming the pair.
    @Test func agreementsRefuseLowOrderKeys() throws {
        var random = SplitMix64(seed: 21)
        let own = SecureAggregationCrypto.generatePrivateKey(using: &random)
        let honest = try SecureAggregationCrypto.publicKey(ofPrivateKey: SecureAggregationCrypto.generatePrivateKey(using: &random))
        #expect(!SecureAggregationCrypto.isLowOrder(honest))
        _ = try SecureAggregationCrypto.pairwiseMaskSeed(privateKey: own, peerPublicKey: honest, device: 1, peer: 2, context: "c")
        for key in [Data(count: 32), Data([1] + [UInt8](repeating: 0, count: 31))] {
            #expect(SecureAggregationCrypto.isLowOrder(key))
            func refused(_ what: String, _ error: SecureAggregationError?) {
                guard let error else {
                    Issue.record("\(what): a low-order key was agreed with")
                    return
                }
                #expect(error.code == .cryptographyFailure && error.message.contains("devices 1 and 9") && error.message.contains("low order"), "\(what)")
            }
            do {
                _ = try SecureAggregationCrypto.pairwiseMaskSeed(privateKey: own, peerPublicKey: key, device: 1, peer: 9, context: "c")
                refused("pairwise seed", nil)
            } catch { refused("pairwise seed", error) }
            do {
                var generator = SplitMix64(seed: 1)
                _ = try SecureAggregationCrypto.seal(Data([1]), privateKey: own, peerPublicKey: key, sender: 1, receiver: 9, context: "c", using: &generator)
                refused("share channel", nil)
            } catch { refused("share channel", error) }
        }
    }

    @Test func pairwiseSeedsAgreeAndDependOnPairAndContext() throws {
        var generator = SplitMix64(seed: 5)
        let a = SecureAggregationCrypto.generatePrivateKey(using: &generator), b = SecureAggregationCrypto.generatePrivateKey(using: &generator)
        let c = SecureAggregationCrypto.generatePrivateKey(using: &generator)
        let pa = try SecureAggregationCrypto.publicKey(ofPrivateKey: a), pb = try SecureAggregationCrypto.publicKey(ofPrivateKey: b)
        let pc = try SecureAggregationCrypto.publicKey(ofPrivateKey: c)
        let ab = try SecureAggregationCrypto.pairwiseMaskSeed(privateKey: a, peerPublicKey: pb, device: 3, peer: 8, context: "x")
        let ba = try SecureAggregationCrypto.pairwiseMaskSeed(privateKey: b, peerPublicKey: pa, device: 8, peer: 3, context: "x")
        #expect(ab == ba && ab.count == 32)
        #expect(try SecureAggregationCrypto.pairwiseMaskSeed(privateKey: a, peerPublicKey: pb, device: 3, peer: 8, context: "y") != ab)
        #expect(try SecureAggregationCrypto.pairwiseMaskSeed(privateKey: a, peerPublicKey: pb, device: 3, peer: 9, context: "x") != ab)
        #expect(try SecureAggregationCrypto.pairwiseMaskSeed(privateKey: a, peerPublicKey: pc, device: 3, peer: 8, context: "x") != ab)
    }

    @Test func sealedSharesOpenOnlyForTheirPairAndContext() throws {
        var generator = SplitMix64(seed: 6)
        let a = SecureAggregationCrypto.generatePrivateKey(using: &generator), b = SecureAggregationCrypto.generatePrivateKey(using: &generator)
        let c = SecureAggregationCrypto.generatePrivateKey(using: &generator)
        let pa = try SecureAggregationCrypto.publicKey(ofPrivateKey: a), pb = try SecureAggregationCrypto.publicKey(ofPrivateKey: b)
        let message = Data("the shares of device 1 for device 2".utf8)
        let sealed = try SecureAggregationCrypto.seal(message, privateKey: a, peerPublicKey: pb, sender: 1, receiver: 2, context: "ctx", using: &generator)
        #expect(sealed.count == message.count + 12 + 16)
        #expect(try SecureAggregationCrypto.open(sealed, privateKey: b, peerPublicKey: pa, sender: 1, receiver: 2, context: "ctx") == message)
        func fails(_ body: () throws -> Data) {
            let error = #expect(throws: SecureAggregationError.self) { _ = try body() }
            #expect(error?.code == .cryptographyFailure)
        }
        var tampered = sealed
        tampered[tampered.startIndex + 20] ^= 1
        fails { try SecureAggregationCrypto.open(tampered, privateKey: b, peerPublicKey: pa, sender: 1, receiver: 2, context: "ctx") }
        // The receiver, the direction and the context are bound.
        fails { try SecureAggregationCrypto.open(sealed, privateKey: c, peerPublicKey: pa, sender: 1, receiver: 2, context: "ctx") }
        fails { try SecureAggregationCrypto.open(sealed, privateKey: b, peerPublicKey: pa, sender: 2, receiver: 1, context: "ctx") }
        fails { try SecureAggregationCrypto.open(sealed, privateKey: b, peerPublicKey: pa, sender: 1, receiver: 2, context: "other") }
        fails { try SecureAggregationCrypto.open(sealed.prefix(10), privateKey: b, peerPublicKey: pa, sender: 1, receiver: 2, context: "ctx") }
    }
}
