public import Foundation
import Crypto

// The actively-secure variant of secure aggregation (Bonawitz et al. 2017, §6): devices sign their advertisements
// with long-term identity keys certified by an authority they trust (so the server cannot invent neighbours), and sign
// the survivor set of masked_input in a consistency round (so the server cannot tell devices different survivor sets).
// All signatures are ECDSA P-256 with SHA-256 from swift-crypto, over domain-separated, length-prefixed bytes.

/// A certificate authority for secure aggregation's identity keys: the app ships its public key, the server is not
/// trusted with it.
public struct SecureAggregationAuthority: Sendable {
    /// The authority's P-256 signing private key, raw 32 bytes.
    public let privateKey: Data
    let key: P256.Signing.PrivateKey

    /// A new authority whose key is drawn from `generator` (give it `SystemRandomNumberGenerator`).
    public init(using generator: inout some RandomNumberGenerator) {
        key = SecureAggregationSigning.generateKey(using: &generator)
        privateKey = key.rawRepresentation
    }

    /// The authority of a raw 32-byte P-256 private key.
    /// - Throws: `cryptography_failure` for bytes that are not a P-256 private key.
    public init(privateKey: Data) throws(SecureAggregationError) {
        key = try SecureAggregationSigning.privateKey(privateKey)
        self.privateKey = key.rawRepresentation
    }

    /// The authority's public key, raw 64 bytes (x ‖ y), to ship in ``SecureAggregationTrust``.
    public var publicKey: Data { key.publicKey.rawRepresentation }

    /// Certifies `signingPublicKey` (raw 64 bytes) for `subject` (at most 256 bytes of UTF-8) until `expiresAt`.
    /// - Throws: `invalid_input` for a key that is not a P-256 public key or a subject that is too long;
    ///   `cryptography_failure` if signing fails.
    public func certify(signingPublicKey: Data, subject: String, expiresAt: Date) throws(SecureAggregationError) -> SecureAggregationCertificate {
        guard (try? P256.Signing.PublicKey(rawRepresentation: signingPublicKey)) != nil else {
            throw SecureAggregationError(.invalidInput, "a certified key must be a raw 64-byte P-256 public key, not \(signingPublicKey.count) bytes")
        }
        guard subject.utf8.count <= SecureAggregationCertificate.maximumSubjectBytes else {
            throw SecureAggregationError(
                .invalidInput, "a certificate subject has at most \(SecureAggregationCertificate.maximumSubjectBytes) bytes, not \(subject.utf8.count)")
        }
        let expires = Int64(expiresAt.timeIntervalSince1970.rounded(.down))
        let bytes = SecureAggregationCertificate.signedBytes(signingPublicKey: signingPublicKey, subject: subject, expiresAt: expires)
        return SecureAggregationCertificate(
            signingPublicKey: signingPublicKey, subject: subject, expiresAt: expires, signature: try SecureAggregationSigning.sign(bytes, with: key))
    }
}

/// An authority's statement that a P-256 signing key belongs to a subject until a time.
public struct SecureAggregationCertificate: Sendable, Hashable, Codable {
    /// The longest subject, in bytes of UTF-8.
    public static let maximumSubjectBytes = 256
    /// The certified P-256 public key, raw 64 bytes.
    public let signingPublicKey: Data
    /// Who holds the key (e.g. a device id); at most 256 bytes.
    public let subject: String
    /// The end of validity, Unix seconds (valid while now is before it).
    public let expiresAt: Int64
    /// The authority's ECDSA P-256 / SHA-256 signature over ``signedBytes(signingPublicKey:subject:expiresAt:)``, raw 64 bytes.
    public let signature: Data

    enum CodingKeys: String, CodingKey {
        case subject, signature
        case signingPublicKey = "signing_public_key"
        case expiresAt = "expires_at"
    }

    /// Creates a certificate from its parts (``SecureAggregationAuthority/certify(signingPublicKey:subject:expiresAt:)`` makes one).
    public init(signingPublicKey: Data, subject: String, expiresAt: Int64, signature: Data) {
        self.signingPublicKey = signingPublicKey
        self.subject = subject
        self.expiresAt = expiresAt
        self.signature = signature
    }

    /// The bytes the authority signs: a domain label, then the key and the subject each length-prefixed, then the
    /// expiry (all integers 8 bytes little-endian), so no two certificates share them.
    public static func signedBytes(signingPublicKey: Data, subject: String, expiresAt: Int64) -> Data {
        var bytes = SignedBytes(domain: "orchard.secure-aggregation.certificate.v1")
        bytes.append(signingPublicKey)
        bytes.append(Data(subject.utf8))
        bytes.append(UInt64(bitPattern: expiresAt))
        return bytes.data
    }

    /// Checks the certificate: a well-formed key and subject, not expired at `now`, signed by one of `authorityPublicKeys`.
    /// - Throws: `verification_failed` naming the first problem.
    public func verify(authorityPublicKeys: [Data], now: Date) throws(SecureAggregationError) {
        func fail(_ message: String) -> SecureAggregationError {
            SecureAggregationError(.verificationFailed, "the certificate of '\(subject.prefix(64))' \(message)")
        }
        guard (try? P256.Signing.PublicKey(rawRepresentation: signingPublicKey)) != nil else { throw fail("holds no valid P-256 public key") }
        guard subject.utf8.count <= Self.maximumSubjectBytes else { throw fail("has a subject longer than \(Self.maximumSubjectBytes) bytes") }
        guard now.timeIntervalSince1970 < Double(expiresAt) else { throw fail("expired at \(expiresAt) (now \(Int64(now.timeIntervalSince1970)))") }
        let bytes = Self.signedBytes(signingPublicKey: signingPublicKey, subject: subject, expiresAt: expiresAt)
        guard authorityPublicKeys.contains(where: { SecureAggregationSigning.isValid(signature, of: bytes, publicKey: $0) }) else {
            throw fail("is not signed by a trusted authority")
        }
    }
}

/// A device's long-term identity: its P-256 signing key and the certificate of its public key. Holds a secret.
public struct SecureAggregationIdentity: Sendable, Hashable, Codable {
    /// The signing private key, raw 32 bytes.
    public let signingPrivateKey: Data
    /// The certificate of the signing public key.
    public let certificate: SecureAggregationCertificate

    enum CodingKeys: String, CodingKey {
        case certificate
        case signingPrivateKey = "signing_private_key"
    }

    /// An identity from its parts.
    /// - Throws: `verification_failed` when the key is not the one the certificate certifies; `cryptography_failure`
    ///   for bytes that are not a P-256 private key.
    public init(signingPrivateKey: Data, certificate: SecureAggregationCertificate) throws(SecureAggregationError) {
        let key = try SecureAggregationSigning.privateKey(signingPrivateKey)
        guard key.publicKey.rawRepresentation == certificate.signingPublicKey else {
            throw SecureAggregationError(.verificationFailed, "the signing key of '\(certificate.subject.prefix(64))' is not the one its certificate certifies")
        }
        self.signingPrivateKey = key.rawRepresentation
        self.certificate = certificate
    }

    /// A fresh key drawn from `generator`, certified by `authority` for `subject` until `expiresAt` (tests, simulator).
    /// - Throws: `invalid_input` for a subject longer than 256 bytes.
    public init(authority: SecureAggregationAuthority, subject: String, expiresAt: Date, using generator: inout some RandomNumberGenerator)
        throws(SecureAggregationError)
    {
        let key = SecureAggregationSigning.generateKey(using: &generator)
        try self.init(
            signingPrivateKey: key.rawRepresentation,
            certificate: try authority.certify(signingPublicKey: key.publicKey.rawRepresentation, subject: subject, expiresAt: expiresAt))
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        do {
            try self.init(
                signingPrivateKey: try c.decode(Data.self, forKey: .signingPrivateKey),
                certificate: try c.decode(SecureAggregationCertificate.self, forKey: .certificate))
        } catch let error as SecureAggregationError {
            throw DecodingError.dataCorruptedError(forKey: .signingPrivateKey, in: c, debugDescription: error.message)
        }
    }

    /// The certificate and this identity's signature for an advertisement of `channelPublicKey` and `maskPublicKey` in
    /// the cycle `context` (a device signs before it knows its index; see
    /// ``SecureAggregationAdvertisement/signedBytes(context:channelPublicKey:maskPublicKey:)``).
    public func advertisementSignature(context: String, channelPublicKey: Data, maskPublicKey: Data) throws(SecureAggregationError)
        -> SecureAggregationAdvertisementSignature
    {
        let bytes = SecureAggregationAdvertisement.signedBytes(context: context, channelPublicKey: channelPublicKey, maskPublicKey: maskPublicKey)
        return SecureAggregationAdvertisementSignature(certificate: certificate, signature: try sign(bytes))
    }

    /// The raw 64-byte ECDSA P-256 / SHA-256 signature of `bytes`.
    public func sign(_ bytes: Data) throws(SecureAggregationError) -> Data {
        try SecureAggregationSigning.sign(bytes, with: try SecureAggregationSigning.privateKey(signingPrivateKey))
    }
}

/// What a device trusts: the authorities' public keys and the time to check certificates' expiry against. A device
/// given a trust takes part only in the actively-secure protocol (signed advertisements and the consistency round).
public struct SecureAggregationTrust: Sendable, Hashable, Codable {
    /// The authorities' P-256 public keys, raw 64 bytes each.
    public var authorityPublicKeys: [Data]
    /// The time certificates must still be valid at.
    public var now: Date

    enum CodingKeys: String, CodingKey {
        case now
        case authorityPublicKeys = "authority_public_keys"
    }

    /// Creates a trust.
    public init(authorityPublicKeys: [Data], now: Date) {
        self.authorityPublicKeys = authorityPublicKeys
        self.now = now
    }
}

/// The signed part of an advertisement: the device's certificate and its identity key's signature over
/// ``SecureAggregationAdvertisement/signedBytes(context:)``.
public struct SecureAggregationAdvertisementSignature: Sendable, Hashable, Codable {
    /// The certificate of the signing key.
    public let certificate: SecureAggregationCertificate
    /// The ECDSA P-256 / SHA-256 signature, raw 64 bytes.
    public let signature: Data

    /// Creates the signed part.
    public init(certificate: SecureAggregationCertificate, signature: Data) {
        self.certificate = certificate
        self.signature = signature
    }
}

extension SecureAggregationAdvertisement {
    /// The bytes an identity key signs: a domain label, the cycle's context, the device index and both public keys.
    public func signedBytes(context: String) -> Data {
        Self.signedBytes(context: context, channelPublicKey: channelPublicKey, maskPublicKey: maskPublicKey)
    }

    /// The bytes an advertisement's signature covers: a domain label, the cycle's context and the two public keys.
    /// The device's index is not among them: a device advertises before the coordinator gives it an index, and two
    /// devices that disagree on an index derive different pairwise keys (HKDF binds both indices), so a roster that
    /// moves a device to another index only makes the exchange fail.
    public static func signedBytes(context: String, channelPublicKey: Data, maskPublicKey: Data) -> Data {
        var bytes = SignedBytes(domain: "orchard.secure-aggregation.advertisement.v2")
        bytes.append(Data(context.utf8))
        bytes.append(channelPublicKey)
        bytes.append(maskPublicKey)
        return bytes.data
    }

    /// The advertisement signed by `identity` for the cycle `context`.
    public func signed(by identity: SecureAggregationIdentity, context: String) throws(SecureAggregationError) -> SecureAggregationAdvertisement {
        SecureAggregationAdvertisement(
            device: device, channelPublicKey: channelPublicKey, maskPublicKey: maskPublicKey,
            signed: try identity.advertisementSignature(context: context, channelPublicKey: channelPublicKey, maskPublicKey: maskPublicKey))
    }

    /// Checks that the advertisement is signed by the key its certificate names (not who certified it).
    /// - Throws: `invalid_message` for an unsigned advertisement or a signature that does not verify.
    public func verifySignature(context: String) throws(SecureAggregationError) {
        guard let signed else { throw SecureAggregationError(.invalidMessage, "device \(device)'s advertisement is not signed") }
        guard signed.certificate.subject.utf8.count <= SecureAggregationCertificate.maximumSubjectBytes else {
            throw SecureAggregationError(
                .invalidMessage, "device \(device)'s certificate subject exceeds \(SecureAggregationCertificate.maximumSubjectBytes) bytes")
        }
        guard SecureAggregationSigning.isValid(signed.signature, of: signedBytes(context: context), publicKey: signed.certificate.signingPublicKey) else {
            throw SecureAggregationError(.invalidMessage, "device \(device)'s advertisement signature does not verify under its certificate's key")
        }
    }
}

extension SecureAggregationConsistencySignature {
    /// `identity`'s signature, for `device`, over `survivors` in the cycle `context`.
    public init(device: Int, signing survivors: [Int], context: String, identity: SecureAggregationIdentity) throws(SecureAggregationError) {
        self.init(device: device, signature: try identity.sign(consistencySignedBytes(context: context, survivors: survivors)))
    }

    /// The bytes signed: a domain label, the context, `consistency`, the survivor count and the survivors.
    public static func signedBytes(context: String, survivors: [Int]) -> Data { consistencySignedBytes(context: context, survivors: survivors) }
}

/// The bytes a device signs in the consistency round: a domain label, the context, `consistency`, and the survivors.
func consistencySignedBytes(context: String, survivors: [Int]) -> Data {
    var bytes = SignedBytes(domain: "orchard.secure-aggregation.consistency.v1")
    bytes.append(Data(context.utf8))
    bytes.append(Data("consistency".utf8))
    bytes.append(UInt64(survivors.count))
    for device in survivors { bytes.append(UInt64(bitPattern: Int64(device))) }
    return bytes.data
}

/// Domain-separated, length-prefixed bytes to sign: the domain label and every byte string are preceded by their
/// length (8 bytes little-endian); integers are 8 bytes little-endian.
struct SignedBytes {
    private(set) var data = Data()

    init(domain: String) { append(Data(domain.utf8)) }

    mutating func append(_ bytes: Data) {
        data.appendLittleEndian(UInt64(bytes.count))
        data.append(bytes)
    }

    mutating func append(_ value: UInt64) { data.appendLittleEndian(value) }
}

/// ECDSA P-256 with SHA-256 from swift-crypto, on raw representations.
enum SecureAggregationSigning {
    static func generateKey(using generator: inout some RandomNumberGenerator) -> P256.Signing.PrivateKey {
        while true {
            // A uniform 32-byte scalar is a valid key unless it is zero or at least the group order (p < 2^-32).
            if let key = try? P256.Signing.PrivateKey(rawRepresentation: SecureAggregationCrypto.randomBytes(32, using: &generator)) { return key }
        }
    }

    static func privateKey(_ raw: Data) throws(SecureAggregationError) -> P256.Signing.PrivateKey {
        do {
            return try P256.Signing.PrivateKey(rawRepresentation: raw)
        } catch {
            throw SecureAggregationError(.cryptographyFailure, "a P-256 private key must be a raw 32-byte scalar, not \(raw.count) bytes")
        }
    }

    static func sign(_ bytes: Data, with key: P256.Signing.PrivateKey) throws(SecureAggregationError) -> Data {
        do {
            return try key.signature(for: bytes).rawRepresentation
        } catch {
            throw SecureAggregationError(.cryptographyFailure, "signing failed: \(error)")
        }
    }

    static func isValid(_ signature: Data, of bytes: Data, publicKey: Data) -> Bool {
        guard let key = try? P256.Signing.PublicKey(rawRepresentation: publicKey),
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signature)
        else { return false }
        return key.isValidSignature(signature, for: bytes)
    }
}
