public import Foundation
import Crypto
import CryptoExtras

/// The cryptography of secure aggregation, all from swift-crypto, behind byte-level signatures: X25519 key
/// agreement, HKDF-SHA256 key derivation, ChaCha20-Poly1305 for the share channel and the AES-256-CTR keystream for
/// mask expansion.
///
/// Derived keys are bound to a label, both device indices (lower first) and the cycle's context string, so keys of
/// different purposes, pairs or cycles never coincide.
public enum SecureAggregationCrypto {
    /// The length of private keys, public keys and seeds.
    public static let keyByteCount = 32
    static let salt = Data("orchard.secure-aggregation.v1".utf8)

    /// A new X25519 private key (raw 32 bytes) drawn from `generator` (give it `SystemRandomNumberGenerator`).
    public static func generatePrivateKey(using generator: inout some RandomNumberGenerator) -> Data {
        randomBytes(keyByteCount, using: &generator)
    }

    /// The X25519 public key (raw 32 bytes) of a raw private key.
    /// - Throws: `cryptography_failure` unless the key is 32 bytes.
    public static func publicKey(ofPrivateKey privateKey: Data) throws(SecureAggregationError) -> Data {
        try agreementKey(privateKey).publicKey.rawRepresentation
    }

    /// The 32-byte seed of the pairwise mask between `device` and `peer`: HKDF-SHA256 over the X25519 shared
    /// secret of the s-keys, labelled `pairwise-mask` with both indices (sorted) and the context. Either side
    /// computes it from its own private key and the other's public key.
    /// - Throws: `cryptography_failure` for a malformed key or a degenerate (low-order) peer key.
    public static func pairwiseMaskSeed(privateKey: Data, peerPublicKey: Data, device: Int, peer: Int, context: String) throws(SecureAggregationError) -> Data {
        try pairwiseMaskSeed(privateKey: try agreementKey(privateKey), peerPublicKey: peerPublicKey, device: device, peer: peer, context: context)
    }

    static func pairwiseMaskSeed(privateKey: Curve25519.KeyAgreement.PrivateKey, peerPublicKey: Data, device: Int, peer: Int, context: String)
        throws(SecureAggregationError) -> Data
    {
        let key = try derivedKey(privateKey: privateKey, peerPublicKey: peerPublicKey, label: "pairwise-mask", device: device, peer: peer, context: context)
        return key.withUnsafeBytes { Data($0) }
    }

    /// Encrypts `plaintext` from `sender` to `receiver` with ChaCha20-Poly1305 under a key HKDF-derived from the
    /// c-keys' shared secret (label `share-channel`); the associated data binds sender, receiver and context. The
    /// result is nonce ‖ ciphertext ‖ tag, the nonce drawn from `generator`.
    /// - Throws: `cryptography_failure` for a malformed or degenerate key.
    public static func seal(
        _ plaintext: Data, privateKey: Data, peerPublicKey: Data, sender: Int, receiver: Int, context: String, using generator: inout some RandomNumberGenerator
    ) throws(SecureAggregationError) -> Data {
        try seal(
            plaintext, privateKey: try agreementKey(privateKey), peerPublicKey: peerPublicKey, sender: sender, receiver: receiver, context: context,
            using: &generator)
    }

    static func seal(
        _ plaintext: Data, privateKey: Curve25519.KeyAgreement.PrivateKey, peerPublicKey: Data, sender: Int, receiver: Int, context: String,
        using generator: inout some RandomNumberGenerator
    ) throws(SecureAggregationError) -> Data {
        let key = try channelKey(privateKey: privateKey, peerPublicKey: peerPublicKey, device: sender, peer: receiver, context: context)
        return try seal(plaintext, key: key, sender: sender, receiver: receiver, context: context, using: &generator)
    }

    /// The share-channel key of a pair (the same from either side; the associated data tells the directions apart).
    static func channelKey(privateKey: Curve25519.KeyAgreement.PrivateKey, peerPublicKey: Data, device: Int, peer: Int, context: String)
        throws(SecureAggregationError) -> SymmetricKey
    {
        try derivedKey(privateKey: privateKey, peerPublicKey: peerPublicKey, label: "share-channel", device: device, peer: peer, context: context)
    }

    static func seal(_ plaintext: Data, key: SymmetricKey, sender: Int, receiver: Int, context: String, using generator: inout some RandomNumberGenerator)
        throws(SecureAggregationError) -> Data
    {
        do {
            let nonce = try ChaChaPoly.Nonce(data: randomBytes(12, using: &generator))
            return try ChaChaPoly.seal(
                plaintext, using: key, nonce: nonce, authenticating: associatedData(sender: sender, receiver: receiver, context: context)
            ).combined
        } catch {
            throw SecureAggregationError(.cryptographyFailure, "sealing a share from device \(sender) to device \(receiver) failed: \(error)")
        }
    }

    /// Decrypts and authenticates what ``seal(_:privateKey:peerPublicKey:sender:receiver:context:using:)`` produced.
    /// - Throws: `cryptography_failure` when the ciphertext was altered, or was sealed for another pair or context.
    public static func open(_ ciphertext: Data, privateKey: Data, peerPublicKey: Data, sender: Int, receiver: Int, context: String)
        throws(SecureAggregationError) -> Data
    {
        try open(ciphertext, privateKey: try agreementKey(privateKey), peerPublicKey: peerPublicKey, sender: sender, receiver: receiver, context: context)
    }

    static func open(_ ciphertext: Data, privateKey: Curve25519.KeyAgreement.PrivateKey, peerPublicKey: Data, sender: Int, receiver: Int, context: String)
        throws(SecureAggregationError) -> Data
    {
        let key = try channelKey(privateKey: privateKey, peerPublicKey: peerPublicKey, device: sender, peer: receiver, context: context)
        return try open(ciphertext, key: key, sender: sender, receiver: receiver, context: context)
    }

    static func open(_ ciphertext: Data, key: SymmetricKey, sender: Int, receiver: Int, context: String) throws(SecureAggregationError) -> Data {
        do {
            let box = try ChaChaPoly.SealedBox(combined: ciphertext)
            return try ChaChaPoly.open(box, using: key, authenticating: associatedData(sender: sender, receiver: receiver, context: context))
        } catch {
            throw SecureAggregationError(.cryptographyFailure, "the share from device \(sender) to device \(receiver) does not authenticate")
        }
    }

    static func associatedData(sender: Int, receiver: Int, context: String) -> Data {
        var data = Data("share".utf8)
        data.appendLittleEndian(UInt64(bitPattern: Int64(sender)))
        data.appendLittleEndian(UInt64(bitPattern: Int64(receiver)))
        data.append(contentsOf: Array(context.utf8))
        return data
    }

    static func derivedKey(privateKey own: Curve25519.KeyAgreement.PrivateKey, peerPublicKey: Data, label: String, device: Int, peer: Int, context: String)
        throws(SecureAggregationError) -> SymmetricKey
    {
        let secret: SharedSecret
        do {
            let other = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: peerPublicKey)
            secret = try own.sharedSecretFromKeyAgreement(with: other)
        } catch {
            throw SecureAggregationError(.cryptographyFailure, "key agreement between devices \(device) and \(peer) failed: \(error)")
        }
        // swift-crypto (like CryptoKit) returns the all-zero secret of a low-order public key without complaint: a key
        // derived from it would be known to anyone, so the agreement is refused here.
        guard secret.withUnsafeBytes({ bytes in bytes.contains { $0 != 0 } }) else {
            throw SecureAggregationError(
                .cryptographyFailure, "key agreement between devices \(device) and \(peer) failed: the peer's public key is of low order")
        }
        var info = Data(label.utf8)
        info.append(0)
        info.appendLittleEndian(UInt64(bitPattern: Int64(min(device, peer))))
        info.appendLittleEndian(UInt64(bitPattern: Int64(max(device, peer))))
        info.append(contentsOf: Array(context.utf8))
        return secret.hkdfDerivedSymmetricKey(using: SHA256.self, salt: salt, sharedInfo: info, outputByteCount: keyByteCount)
    }

    /// Whether `publicKey` is a point of low order (the all-zero key among them): any agreement with it gives the
    /// all-zero secret, whatever the private key. A 32-byte key only; checked by one agreement with a fixed scalar.
    public static func isLowOrder(_ publicKey: Data) -> Bool {
        guard publicKey.count == keyByteCount, let key = try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: publicKey),
            let secret = try? lowOrderProbe.sharedSecretFromKeyAgreement(with: key)
        else { return false }
        return secret.withUnsafeBytes { bytes in !bytes.contains { $0 != 0 } }
    }

    /// Any scalar serves (X25519 clamps it to a multiple of the cofactor); this one is SHA-256 of its name.
    private static let lowOrderProbe: Curve25519.KeyAgreement.PrivateKey = {
        guard let key = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: Data(SHA256.hash(data: Data("orchard.low-order-probe".utf8))))
        else { preconditionFailure("32 bytes are an X25519 private key") }
        return key
    }()

    static func agreementKey(_ raw: Data) throws(SecureAggregationError) -> Curve25519.KeyAgreement.PrivateKey {
        do {
            return try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: raw)
        } catch {
            throw SecureAggregationError(.cryptographyFailure, "an X25519 private key must be 32 bytes, not \(raw.count)")
        }
    }

    static func randomBytes(_ count: Int, using generator: inout some RandomNumberGenerator) -> Data {
        var data = Data(capacity: count + 8)
        while data.count < count { data.appendLittleEndian(generator.next() as UInt64) }
        return data.prefix(count)
    }
}

/// Mask expansion: a 32-byte seed stretched into words modulo 2^bits by the AES-256-CTR keystream (seed as key, zero
/// nonce and counter; with AES-NI it ran 4.4 times as fast as ChaCha20 on the 2-core development machine, `openssl speed`,
/// and a mask is the protocol's largest computation), read as little-endian UInt32s and reduced by masking (uniform, the modulus being a power of
/// two). Each seed keys one stream: pairwise seeds differ per pair and cycle, self-mask seeds are fresh.
public enum MaskExpansion {
    /// `count` words modulo 2^`modulusBits` from `seed`; equal seeds give equal words.
    /// - Throws: `cryptography_failure` unless the seed is 32 bytes.
    public static func expand(seed: Data, count: Int, modulusBits: Int) throws(SecureAggregationError) -> [UInt32] {
        var words = [UInt32](repeating: 0, count: count)
        try apply(seed: seed, to: &words, modulusBits: modulusBits, subtracting: false)
        return words
    }

    /// One mask to apply: the 32-byte seed of its keystream, and whether it is subtracted (else added).
    struct Stream: Sendable {
        var seed: Data
        var subtracting: Bool
    }

    /// Words per keystream chunk: 64 KiB, so a chunk is made and added while it is in cache, and no buffer the
    /// model's size is allocated (and zeroed by the kernel) per stream.
    static let chunkWords = 16_384
    /// A chunk's worth of zero bytes: AES-CTR of zeros is the keystream.
    private static let zeros = Data(count: 4 * chunkWords)

    /// Adds (or subtracts) the expansion of `seed` to `words` modulo 2^`modulusBits`.
    static func apply(seed: Data, to words: inout [UInt32], modulusBits: Int, subtracting: Bool) throws(SecureAggregationError) {
        try apply([Stream(seed: seed, subtracting: subtracting)], to: &words, modulusBits: modulusBits)
    }

    /// Adds (or subtracts) every stream's expansion to `words` modulo 2^`modulusBits`, chunk by chunk and every stream
    /// within a chunk, so the chunk of `words` stays in cache while all the streams are added to it. Chunk j of a
    /// stream is its keystream from counter block j · (chunk blocks), so the words are exactly those of one AES-256-CTR
    /// keystream of the whole length from a zero counter block.
    static func apply(_ streams: [Stream], to words: inout [UInt32], modulusBits: Int) throws(SecureAggregationError) {
        for stream in streams where stream.seed.count != SecureAggregationCrypto.keyByteCount {
            throw SecureAggregationError(.cryptographyFailure, "a mask seed must be 32 bytes, not \(stream.seed.count)")
        }
        let mask: UInt32 = modulusBits >= 32 ? .max : (UInt32(1) << UInt32(modulusBits)) &- 1
        let keys = streams.map { SymmetricKey(data: $0.seed) }
        let blocksPerChunk = UInt64(4 * chunkWords / 16)
        var start = 0, chunk: UInt64 = 0
        while start < words.count {
            let count = min(chunkWords, words.count - start)
            // The 128-bit big-endian counter block where this chunk starts.
            var counter = [UInt8](repeating: 0, count: 16)
            withUnsafeBytes(of: (chunk * blocksPerChunk).bigEndian) { counter.replaceSubrange(8..<16, with: $0) }
            for (key, stream) in zip(keys, streams) {
                let keystream: Data
                do {
                    keystream = try AES._CTR.encrypt(zeros.prefix(4 * count), using: key, nonce: AES._CTR.Nonce(nonceBytes: counter))
                } catch {
                    throw SecureAggregationError(.cryptographyFailure, "expanding a mask seed failed: \(error)")
                }
                keystream.withUnsafeBytes { raw in
                    words.withUnsafeMutableBufferPointer { all in
                        ModularWords.accumulate(
                            into: UnsafeMutableBufferPointer(rebasing: all[start..<(start + count)]), littleEndian: raw, mask: mask,
                            subtracting: stream.subtracting)
                    }
                }
            }
            start += count
            chunk += 1
        }
    }
}

/// Word arithmetic modulo 2^bits (a power of two: add, then mask), eight words at a time.
enum ModularWords {
    /// `out[i] = (out[i] ± w[i]) & mask`, where w is `bytes` read as little-endian UInt32s (at least `out.count` of them).
    @inline(__always)
    static func accumulate(into out: UnsafeMutableBufferPointer<UInt32>, littleEndian bytes: UnsafeRawBufferPointer, mask: UInt32, subtracting: Bool) {
        precondition(bytes.count >= 4 * out.count, "fewer words than the output")
        let count = out.count
        guard count > 0, let target = out.baseAddress, let source = bytes.baseAddress else { return }
        var i = 0
        #if _endian(little)
        let lanes = SIMD8<UInt32>(repeating: mask)
        let raw = UnsafeMutableRawPointer(target)
        if subtracting {
            while i + 8 <= count {
                let sum =
                    raw.loadUnaligned(fromByteOffset: 4 * i, as: SIMD8<UInt32>.self) &- source.loadUnaligned(fromByteOffset: 4 * i, as: SIMD8<UInt32>.self)
                raw.storeBytes(of: sum & lanes, toByteOffset: 4 * i, as: SIMD8<UInt32>.self)
                i += 8
            }
        } else {
            while i + 8 <= count {
                let sum =
                    raw.loadUnaligned(fromByteOffset: 4 * i, as: SIMD8<UInt32>.self) &+ source.loadUnaligned(fromByteOffset: 4 * i, as: SIMD8<UInt32>.self)
                raw.storeBytes(of: sum & lanes, toByteOffset: 4 * i, as: SIMD8<UInt32>.self)
                i += 8
            }
        }
        #endif
        while i < count {
            let word = UInt32(littleEndian: source.loadUnaligned(fromByteOffset: 4 * i, as: UInt32.self))
            target[i] = (subtracting ? target[i] &- word : target[i] &+ word) & mask
            i += 1
        }
    }

    /// `sum[i] = (sum[i] + words[i]) & mask` (native words, as many as `sum` has).
    static func add(_ words: [UInt32], into sum: inout [UInt32], mask: UInt32) {
        precondition(words.count == sum.count, "adding \(words.count) words to \(sum.count)")
        #if _endian(little)
        words.withUnsafeBytes { bytes in
            sum.withUnsafeMutableBufferPointer { accumulate(into: $0, littleEndian: bytes, mask: mask, subtracting: false) }
        }
        #else
        for i in words.indices { sum[i] = (sum[i] &+ words[i]) & mask }
        #endif
    }
}
