import Crypto
public import Foundation
import SwiftASN1
import X509

/// A throwaway private certificate authority and a server certificate it signed for `localhost` and `127.0.0.1`
/// (P-256, made fresh for each test, valid from an hour ago for a day), as PEM.
public struct TestCertificates: Sendable {
    /// The authority's certificate, for a client's trust roots.
    public let caCertificatePEM: String
    /// The server's certificate (leaf only).
    public let serverCertificatePEM: String
    /// The server's private key (PKCS #8).
    public let serverPrivateKeyPEM: String

    /// Makes a new authority and server certificate; `commonName` names the authority.
    public static func make(commonName: String = "Orchard Test CA", now: Date = Date()) throws -> TestCertificates {
        let caKey = P256.Signing.PrivateKey()
        let caName = try DistinguishedName { CommonName(commonName) }
        let ca = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(caKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600), notValidAfter: now.addingTimeInterval(86_400), issuer: caName, subject: caName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
            },
            issuerPrivateKey: Certificate.PrivateKey(caKey)
        )
        let serverKey = P256.Signing.PrivateKey()
        let server = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(serverKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600), notValidAfter: now.addingTimeInterval(86_400), issuer: caName,
            subject: try DistinguishedName { CommonName("localhost") },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames([.dnsName("localhost"), .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1]))])
            },
            issuerPrivateKey: Certificate.PrivateKey(caKey)
        )
        return TestCertificates(
            caCertificatePEM: try ca.serializeAsPEM().pemString, serverCertificatePEM: try server.serializeAsPEM().pemString,
            serverPrivateKeyPEM: serverKey.pemRepresentation
        )
    }

    /// Writes `ca.pem`, `server.pem` and `server-key.pem` (mode 0600) into `directory` and returns their paths.
    public func write(to directory: URL) throws -> (ca: String, certificate: String, key: String) {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let ca = directory.appendingPathComponent("ca.pem")
        let certificate = directory.appendingPathComponent("server.pem")
        let key = directory.appendingPathComponent("server-key.pem")
        try Data(caCertificatePEM.utf8).write(to: ca)
        try Data(serverCertificatePEM.utf8).write(to: certificate)
        try Data(serverPrivateKeyPEM.utf8).write(to: key)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key.path)
        return (ca.path, certificate.path, key.path)
    }
}
