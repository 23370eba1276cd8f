import Foundation
import OrchardSupport
import NIOSSL
import OrchardProtocol

/// The coordinator's HTTPS identity: a certificate chain and its private key, both PEM, checked when loaded so a
/// bad file is reported before the server listens.
public struct CoordinatorTLS: Sendable {
    /// The TLS settings the server is built with (TLS 1.2 and later, no client certificates).
    let configuration: TLSConfiguration

    /// Loads the certificate chain (leaf first) and the private key from PEM files.
    /// - Throws: ``CoordinatorError`` `invalid_configuration` naming the file when it is missing, unreadable, not
    ///   PEM, holds no certificate or key, or the key does not belong to the certificate.
    public static func load(certificateFile: String, privateKeyFile: String) throws(CoordinatorError) -> CoordinatorTLS {
        try CoordinatorTLS(
            certificateChainPEM: try read(certificateFile, "certificate"), privateKeyPEM: try read(privateKeyFile, "private key"),
            certificateSource: "TLS certificate file '\(certificateFile)'", keySource: "TLS private key file '\(privateKeyFile)'"
        )
    }

    /// Creates the identity from PEM bytes.
    /// - Throws: ``CoordinatorError`` `invalid_configuration` when either is not usable PEM or they do not match.
    public init(certificateChainPEM: [UInt8], privateKeyPEM: [UInt8]) throws(CoordinatorError) {
        try self.init(
            certificateChainPEM: certificateChainPEM, privateKeyPEM: privateKeyPEM, certificateSource: "the TLS certificate", keySource: "the TLS private key")
    }

    private init(certificateChainPEM: [UInt8], privateKeyPEM: [UInt8], certificateSource: String, keySource: String) throws(CoordinatorError) {
        guard String(decoding: certificateChainPEM, as: UTF8.self).contains("-----BEGIN CERTIFICATE-----") else {
            throw CoordinatorError(.invalidConfiguration, "\(certificateSource) holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        }
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMBytes(certificateChainPEM)
        } catch {
            throw CoordinatorError(.invalidConfiguration, "\(certificateSource) is not a PEM certificate chain (\(error))")
        }
        guard !chain.isEmpty else {
            throw CoordinatorError(.invalidConfiguration, "\(certificateSource) holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        }
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(bytes: privateKeyPEM, format: .pem)
        } catch {
            // The key's bytes are secret: the message names the file, never its content.
            throw CoordinatorError(.invalidConfiguration, "\(keySource) is not an unencrypted PEM private key")
        }
        let configuration = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        do {
            // Building a context checks that the key belongs to the leaf certificate.
            _ = try NIOSSLContext(configuration: configuration)
        } catch {
            throw CoordinatorError(.invalidConfiguration, "\(keySource) does not match the certificate of \(certificateSource) (\(error))")
        }
        self.configuration = configuration
    }

    private static func read(_ path: String, _ what: String) throws(CoordinatorError) -> [UInt8] {
        do throws(FileAccessError) { return [UInt8](try LocalFile.read(path)) } catch {
            throw CoordinatorError(.invalidConfiguration, "TLS \(what) file '\(path)': \(error.message)")
        }
    }
}
