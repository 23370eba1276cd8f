public import Foundation

/// The stages of a secure-aggregation cycle, in order; a server ends in `done` or `abandoned`.
public enum SecureAggregationStage: String, Sendable, Hashable, Codable {
    /// Devices advertise their two public keys.
    case advertiseKeys = "advertise_keys"
    /// Devices send encrypted shares of their secrets to their neighbours through the server.
    case shareKeys = "share_keys"
    /// Devices send their masked inputs.
    case maskedInput = "masked_input"
    /// Devices sign the set of devices whose masked inputs the server holds (configuration `consistency_check`).
    case consistencyCheck = "consistency_check"
    /// Devices reveal the shares the server needs to remove the masks.
    case unmask
    /// The server has the aggregate.
    case done
    /// Too few devices remained; the cycle has no aggregate.
    case abandoned
}

/// Device → server (stage advertise_keys): the device's two X25519 public keys, raw 32 bytes each.
public struct SecureAggregationAdvertisement: Sendable, Hashable, Codable {
    /// The device's index in the cycle (≥ 1; also its Shamir evaluation point).
    public let device: Int
    /// The c key, for the encrypted share channel.
    public let channelPublicKey: Data
    /// The s key, for pairwise mask seeds.
    public let maskPublicKey: Data
    /// The actively-secure variant's certificate and identity-key signature over the index and both keys (absent
    /// otherwise, and then not encoded).
    public let signed: SecureAggregationAdvertisementSignature?

    enum CodingKeys: String, CodingKey {
        case device, signed
        case channelPublicKey = "channel_public_key"
        case maskPublicKey = "mask_public_key"
    }

    /// Creates an advertisement.
    public init(device: Int, channelPublicKey: Data, maskPublicKey: Data, signed: SecureAggregationAdvertisementSignature? = nil) {
        self.device = device
        self.channelPublicKey = channelPublicKey
        self.maskPublicKey = maskPublicKey
        self.signed = signed
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        device = try c.decode(Int.self, forKey: .device)
        channelPublicKey = try c.decode(Data.self, forKey: .channelPublicKey)
        maskPublicKey = try c.decode(Data.self, forKey: .maskPublicKey)
        signed = try c.decodeIfPresent(SecureAggregationAdvertisementSignature.self, forKey: .signed)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(device, forKey: .device)
        try c.encode(channelPublicKey, forKey: .channelPublicKey)
        try c.encode(maskPublicKey, forKey: .maskPublicKey)
        try c.encodeIfPresent(signed, forKey: .signed)
    }
}

/// Server → device (after advertise_keys): who takes part, the public seed of the neighbour graph, and the
/// advertisements of the device's neighbours and of the device itself.
public struct SecureAggregationRoster: Sendable, Hashable, Codable {
    /// Every device that advertised in time, ascending.
    public let participants: [Int]
    /// The public seed of the SecAgg+ neighbour ring.
    public let graphSeed: Data
    /// The advertisements of the receiver's neighbours and its own.
    public let keys: [SecureAggregationAdvertisement]

    enum CodingKeys: String, CodingKey {
        case participants, keys
        case graphSeed = "graph_seed"
    }

    /// Creates a roster.
    public init(participants: [Int], graphSeed: Data, keys: [SecureAggregationAdvertisement]) {
        self.participants = participants
        self.graphSeed = graphSeed
        self.keys = keys
    }
}

/// One encrypted share bundle: the sender's Shamir shares of its self-mask seed and of its s private key, for the
/// receiver, sealed with ChaCha20-Poly1305 (nonce ‖ ciphertext ‖ tag).
public struct SecureAggregationEncryptedShare: Sendable, Hashable, Codable {
    /// The device that made the shares.
    public let sender: Int
    /// The device that holds them.
    public let receiver: Int
    /// The sealed bundle.
    public let ciphertext: Data

    /// Creates an encrypted share.
    public init(sender: Int, receiver: Int, ciphertext: Data) {
        self.sender = sender
        self.receiver = receiver
        self.ciphertext = ciphertext
    }
}

/// Device → server (stage share_keys): one encrypted share bundle per neighbour.
public struct SecureAggregationShareKeys: Sendable, Hashable, Codable {
    /// The sending device.
    public let device: Int
    /// One bundle per neighbour, ascending by receiver.
    public let shares: [SecureAggregationEncryptedShare]

    /// Creates the message.
    public init(device: Int, shares: [SecureAggregationEncryptedShare]) {
        self.device = device
        self.shares = shares
    }
}

/// Server → device (after share_keys): the bundles addressed to the device from neighbours that completed share_keys.
public struct SecureAggregationShareDelivery: Sendable, Hashable, Codable {
    /// The receiving device.
    public let device: Int
    /// The bundles, ascending by sender.
    public let shares: [SecureAggregationEncryptedShare]

    /// Creates a delivery.
    public init(device: Int, shares: [SecureAggregationEncryptedShare]) {
        self.device = device
        self.shares = shares
    }
}

/// Device → server (stage masked_input): the masked words, model length + 1 (the last one carries the sample
/// count), each below 2^modulus_bits.
public struct SecureAggregationMaskedInput: Sendable, Hashable, Codable {
    /// The sending device.
    public let device: Int
    /// The masked words.
    public var words: [UInt32]

    enum CodingKeys: String, CodingKey { case device, words }

    /// Creates the message.
    public init(device: Int, words: [UInt32]) {
        self.device = device
        self.words = words
    }

    /// Decodes `words` from base64 of little-endian 32-bit words (4 bytes per word, a third more in base64, rather
    /// than up to 11 characters per word as a JSON array).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        device = try c.decode(Int.self, forKey: .device)
        let text = try c.decode(String.self, forKey: .words)
        guard let bytes = Data(base64Encoded: text), bytes.count % 4 == 0 else {
            throw DecodingError.dataCorruptedError(forKey: .words, in: c, debugDescription: "words must be base64 of little-endian 32-bit words")
        }
        words = Self.words(fromLittleEndian: bytes)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(device, forKey: .device)
        try c.encode(Self.littleEndianBytes(words).base64EncodedString(), forKey: .words)
    }

    /// The words as little-endian bytes.
    public static func littleEndianBytes(_ words: [UInt32]) -> Data {
        #if _endian(little)
        return words.withUnsafeBytes { Data($0) }
        #else
        var data = Data(count: words.count * 4)
        data.withUnsafeMutableBytes { raw in
            for (i, word) in words.enumerated() { raw.storeBytes(of: word.littleEndian, toByteOffset: i * 4, as: UInt32.self) }
        }
        return data
        #endif
    }

    /// Words from little-endian bytes (a multiple of 4).
    public static func words(fromLittleEndian bytes: Data) -> [UInt32] {
        bytes.withUnsafeBytes { raw in
            let count = raw.count / 4
            #if _endian(little)
            return [UInt32](unsafeUninitializedCapacity: count) { buffer, initialized in
                if count > 0 { UnsafeMutableRawPointer(buffer.baseAddress!).copyMemory(from: raw.baseAddress!, byteCount: 4 * count) }
                initialized = count
            }
            #else
            return (0..<count).map { UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self)) }
            #endif
        }
    }
}

/// Server → device (after masked_input): which of the device's neighbours sent their masked input (survivors) and
/// which completed share_keys but did not (dropped).
public struct SecureAggregationUnmaskRequest: Sendable, Hashable, Codable {
    /// The device asked.
    public let device: Int
    /// Neighbours whose self-mask seed shares are wanted, ascending.
    public let survivors: [Int]
    /// Neighbours whose s-key shares are wanted, ascending.
    public let dropped: [Int]
    /// With consistency_check: the consistency signatures of the device's neighbours that signed (U4), ascending by
    /// device; nil (and not encoded) otherwise.
    public let signatures: [SecureAggregationConsistencySignature]?

    enum CodingKeys: String, CodingKey { case device, survivors, dropped, signatures }

    /// Creates a request.
    public init(device: Int, survivors: [Int], dropped: [Int], signatures: [SecureAggregationConsistencySignature]? = nil) {
        self.device = device
        self.survivors = survivors
        self.dropped = dropped
        self.signatures = signatures
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        device = try c.decode(Int.self, forKey: .device)
        survivors = try c.decode([Int].self, forKey: .survivors)
        dropped = try c.decode([Int].self, forKey: .dropped)
        signatures = try c.decodeIfPresent([SecureAggregationConsistencySignature].self, forKey: .signatures)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(device, forKey: .device)
        try c.encode(survivors, forKey: .survivors)
        try c.encode(dropped, forKey: .dropped)
        try c.encodeIfPresent(signatures, forKey: .signatures)
    }
}

/// Server → device (stage consistency_check): U3, every device whose masked input the server holds.
public struct SecureAggregationConsistencyRequest: Sendable, Hashable, Codable {
    /// The device asked.
    public let device: Int
    /// The devices whose masked inputs are in the sum, ascending.
    public let survivors: [Int]

    /// Creates a request.
    public init(device: Int, survivors: [Int]) {
        self.device = device
        self.survivors = survivors
    }
}

/// Device → server (stage consistency_check), and server → device inside an unmask request: a device's identity-key
/// signature (raw 64-byte ECDSA P-256 / SHA-256) over the context and the survivor list it was given.
public struct SecureAggregationConsistencySignature: Sendable, Hashable, Codable {
    /// The signing device.
    public let device: Int
    /// The signature, raw 64 bytes.
    public let signature: Data

    /// Creates a signature message.
    public init(device: Int, signature: Data) {
        self.device = device
        self.signature = signature
    }

    /// Whether `signature` is `publicKey`'s signature over `survivors` in the cycle `context`.
    public func isValid(survivors: [Int], context: String, publicKey: Data) -> Bool {
        SecureAggregationSigning.isValid(signature, of: consistencySignedBytes(context: context, survivors: survivors), publicKey: publicKey)
    }
}

/// One revealed share: whose secret it belongs to, and the share (its index is the revealing device).
public struct SecureAggregationRevealedShare: Sendable, Hashable, Codable {
    /// The device whose secret was shared.
    public let owner: Int
    /// The share.
    public let share: ShamirShare

    /// Creates a revealed share.
    public init(owner: Int, share: ShamirShare) {
        self.owner = owner
        self.share = share
    }
}

/// Device → server (stage unmask): self-mask seed shares of survivors, s-key shares of dropped devices.
public struct SecureAggregationUnmaskResponse: Sendable, Hashable, Codable {
    /// The revealing device.
    public let device: Int
    /// Shares of survivors' self-mask seeds.
    public let selfMaskShares: [SecureAggregationRevealedShare]
    /// Shares of dropped devices' s private keys.
    public let secretKeyShares: [SecureAggregationRevealedShare]

    enum CodingKeys: String, CodingKey {
        case device
        case selfMaskShares = "self_mask_shares"
        case secretKeyShares = "secret_key_shares"
    }

    /// Creates a response.
    public init(device: Int, selfMaskShares: [SecureAggregationRevealedShare], secretKeyShares: [SecureAggregationRevealedShare]) {
        self.device = device
        self.selfMaskShares = selfMaskShares
        self.secretKeyShares = secretKeyShares
    }
}

/// The unmasked aggregate of a cycle.
public struct SecureAggregationResult: Sendable, Hashable, Codable {
    /// S = Σ n_i q_i per coordinate (mod 2^modulus_bits; validation keeps it from wrapping).
    public let sum: [UInt32]
    /// N = Σ n_i.
    public let totalSampleCount: Int
    /// The devices whose inputs are in the sum, ascending.
    public let survivors: [Int]
    /// The dequantised weighted mean Σ n_i x_i / N (within 2c/(Q − 1) of the clipped inputs' mean).
    public let mean: [Float]

    enum CodingKeys: String, CodingKey {
        case sum, survivors, mean
        case totalSampleCount = "total_sample_count"
    }

    /// Creates a result.
    public init(sum: [UInt32], totalSampleCount: Int, survivors: [Int], mean: [Float]) {
        self.sum = sum
        self.totalSampleCount = totalSampleCount
        self.survivors = survivors
        self.mean = mean
    }
}

/// The bundle a device seals for a neighbour: sender, receiver, and its two shares, as little-endian words.
struct ShareBundle {
    var sender: Int
    var receiver: Int
    var selfMaskShare: ShamirShare
    var secretKeyShare: ShamirShare

    static let chunks = ShamirSecretSharing.chunkCount(byteCount: SecureAggregationCrypto.keyByteCount)

    var encoded: Data {
        var data = Data()
        data.appendLittleEndian(UInt64(bitPattern: Int64(sender)))
        data.appendLittleEndian(UInt64(bitPattern: Int64(receiver)))
        data.append(selfMaskShare.bytes)
        data.append(secretKeyShare.bytes)
        return data
    }

    init(sender: Int, receiver: Int, selfMaskShare: ShamirShare, secretKeyShare: ShamirShare) {
        self.sender = sender
        self.receiver = receiver
        self.selfMaskShare = selfMaskShare
        self.secretKeyShare = secretKeyShare
    }

    init?(_ data: Data) {
        guard data.count == 16 + 16 * Self.chunks, let words = ShamirShare.values(from: data) else { return nil }
        sender = Int(Int64(bitPattern: words[0]))
        receiver = Int(Int64(bitPattern: words[1]))
        selfMaskShare = ShamirShare(index: receiver, values: Array(words[2..<(2 + Self.chunks)]))
        secretKeyShare = ShamirShare(index: receiver, values: Array(words[(2 + Self.chunks)...]))
    }
}
