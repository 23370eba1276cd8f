import Foundation
import OrchardPrivacy
import OrchardSupport
import Testing

/// Certificates and identities of the actively-secure variant: what verifies and what is refused.
@Suite struct SecureAggregationCertificateTests {
    static let now = SignedFixture.now

    static func verifyCode(_ certificate: SecureAggregationCertificate, keys: [Data], now: Date = now) -> SecureAggregationError.Code? {
        secAggCode { try certificate.verify(authorityPublicKeys: keys, now: now) }
    }

    @Test func certificateVerifiesAndAlterationsAreRefused() throws {
        var generator = SplitMix64(seed: 11)
        let authority = SecureAggregationAuthority(using: &generator)
        let other = SecureAggregationAuthority(using: &generator)
        #expect(authority.publicKey.count == 64 && authority.privateKey.count == 32)
        let identity = try SecureAggregationIdentity(authority: authority, subject: "device-1", expiresAt: SignedFixture.expiry, using: &generator)
        let certificate = identity.certificate
        #expect(certificate.signingPublicKey.count == 64 && certificate.signature.count == 64)
        #expect(certificate.expiresAt == Int64(SignedFixture.expiry.timeIntervalSince1970))
        try certificate.verify(authorityPublicKeys: [authority.publicKey], now: Self.now)
        // Any of several authorities will do.
        try certificate.verify(authorityPublicKeys: [other.publicKey, authority.publicKey], now: Self.now)

        // Wrong authority; expired (at and after the expiry).
        #expect(Self.verifyCode(certificate, keys: [other.publicKey]) == .verificationFailed)
        #expect(Self.verifyCode(certificate, keys: []) == .verificationFailed)
        #expect(Self.verifyCode(certificate, keys: [authority.publicKey], now: SignedFixture.expiry) == .verificationFailed)
        #expect(Self.verifyCode(certificate, keys: [authority.publicKey], now: SignedFixture.expiry.addingTimeInterval(86400)) == .verificationFailed)

        // Altered subject, key, expiry; truncated or flipped signature.
        let otherKey = try SecureAggregationIdentity(authority: authority, subject: "device-2", expiresAt: SignedFixture.expiry, using: &generator).certificate
            .signingPublicKey
        let altered = [
            SecureAggregationCertificate(
                signingPublicKey: certificate.signingPublicKey, subject: "device-2", expiresAt: certificate.expiresAt, signature: certificate.signature),
            SecureAggregationCertificate(
                signingPublicKey: otherKey, subject: certificate.subject, expiresAt: certificate.expiresAt, signature: certificate.signature),
            SecureAggregationCertificate(
                signingPublicKey: certificate.signingPublicKey, subject: certificate.subject, expiresAt: certificate.expiresAt + 86400,
                signature: certificate.signature),
            SecureAggregationCertificate(
                signingPublicKey: certificate.signingPublicKey, subject: certificate.subject, expiresAt: certificate.expiresAt,
                signature: certificate.signature.prefix(63)),
            SecureAggregationCertificate(
                signingPublicKey: certificate.signingPublicKey, subject: certificate.subject, expiresAt: certificate.expiresAt, signature: Data()),
            SecureAggregationCertificate(
                signingPublicKey: certificate.signingPublicKey.prefix(63), subject: certificate.subject, expiresAt: certificate.expiresAt,
                signature: certificate.signature),
        ]
        for certificate in altered { #expect(Self.verifyCode(certificate, keys: [authority.publicKey]) == .verificationFailed) }
        var flipped = certificate.signature
        flipped[flipped.startIndex + 10] ^= 0x01
        let forged = SecureAggregationCertificate(
            signingPublicKey: certificate.signingPublicKey, subject: certificate.subject, expiresAt: certificate.expiresAt, signature: flipped)
        #expect(Self.verifyCode(forged, keys: [authority.publicKey]) == .verificationFailed)
    }

    /// The signed bytes are length-prefixed: moving bytes between the key and the subject changes them.
    @Test func signedBytesAreUnambiguous() {
        let key = Data(repeating: 7, count: 64)
        let a = SecureAggregationCertificate.signedBytes(signingPublicKey: key, subject: "ab", expiresAt: 5)
        let b = SecureAggregationCertificate.signedBytes(signingPublicKey: key + Data("a".utf8), subject: "b", expiresAt: 5)
        let c = SecureAggregationCertificate.signedBytes(signingPublicKey: key, subject: "ab", expiresAt: 6)
        #expect(a != b && a != c && b != c)
        #expect(String(decoding: a, as: UTF8.self).contains("orchard.secure-aggregation.certificate.v1"))
        #expect(
            SecureAggregationConsistencySignature.signedBytes(context: "x", survivors: [1, 2])
                != SecureAggregationConsistencySignature.signedBytes(context: "x", survivors: [1, 2, 3]))
        #expect(
            SecureAggregationConsistencySignature.signedBytes(context: "x", survivors: [1, 2])
                != SecureAggregationConsistencySignature.signedBytes(context: "y", survivors: [1, 2]))
    }

    @Test func identityMustMatchItsCertificate() throws {
        var generator = SplitMix64(seed: 12)
        let authority = SecureAggregationAuthority(using: &generator)
        let one = try SecureAggregationIdentity(authority: authority, subject: "device-1", expiresAt: SignedFixture.expiry, using: &generator)
        let two = try SecureAggregationIdentity(authority: authority, subject: "device-2", expiresAt: SignedFixture.expiry, using: &generator)
        #expect(secAggCode { _ = try SecureAggregationIdentity(signingPrivateKey: one.signingPrivateKey, certificate: two.certificate) } == .verificationFailed)
        #expect(secAggCode { _ = try SecureAggregationIdentity(signingPrivateKey: Data(count: 31), certificate: one.certificate) } == .cryptographyFailure)
        let same = try SecureAggregationIdentity(signingPrivateKey: one.signingPrivateKey, certificate: one.certificate)
        #expect(same == one)
        // The authority restored from its raw key certifies alike; an over-long subject or a bad key is refused.
        let restored = try SecureAggregationAuthority(privateKey: authority.privateKey)
        #expect(restored.publicKey == authority.publicKey)
        #expect(
            secAggCode {
                _ = try authority.certify(
                    signingPublicKey: one.certificate.signingPublicKey, subject: String(repeating: "x", count: 257), expiresAt: SignedFixture.expiry)
            } == .invalidInput)
        #expect(secAggCode { _ = try authority.certify(signingPublicKey: Data(count: 64), subject: "x", expiresAt: SignedFixture.expiry) } == .invalidInput)
        // Identities and certificates round-trip through JSON with snake_case keys; a mismatched identity does not decode.
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.withoutEscapingSlashes]
        let json = String(decoding: try encoder.encode(one), as: UTF8.self)
        #expect(json.contains("\"signing_private_key\"") && json.contains("\"signing_public_key\"") && json.contains("\"expires_at\""))
        #expect(try JSONDecoder().decode(SecureAggregationIdentity.self, from: Data(json.utf8)) == one)
        #expect(json.contains(one.signingPrivateKey.base64EncodedString()))
        let mismatched = json.replacingOccurrences(of: one.signingPrivateKey.base64EncodedString(), with: two.signingPrivateKey.base64EncodedString())
        #expect(throws: DecodingError.self) { _ = try JSONDecoder().decode(SecureAggregationIdentity.self, from: Data(mismatched.utf8)) }
    }
}
