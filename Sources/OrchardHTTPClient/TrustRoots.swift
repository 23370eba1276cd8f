import Foundation
package import NIOSSL
import OrchardSupport

/// The certificate authorities an HTTPS client trusts: the platform's, or only a private CA's.
public struct TrustRoots: Sendable, Hashable, CustomStringConvertible {
    private enum Source: Sendable, Hashable {
        case system
        case pem([UInt8], origin: String)
    }
    private let source: Source

    /// The platform's trust store.
    public static let system = TrustRoots(source: .system)

    /// Only the CA certificates in `pem` (one or more PEM certificates), e.g. a private CA's.
    public static func certificates(pem: String) -> TrustRoots {
        TrustRoots(source: .pem(Array(pem.utf8), origin: "the CA certificates given"))
    }

    /// Only the CA certificates in the PEM file at `path` (read now; checked when a client is created).
    /// - Throws: ``ConnectionError/Code/invalidConfiguration`` when the file is missing or unreadable.
    public static func certificateFile(_ path: String) throws(ConnectionError) -> TrustRoots {
        let data: Data
        do throws(FileAccessError) { data = try LocalFile.read(path) } catch {
            throw ConnectionError(.invalidConfiguration, "CA certificate file '\(path)': \(error.message)")
        }
        return TrustRoots(source: .pem([UInt8](data), origin: "CA certificate file '\(path)'"))
    }

    /// Whether these are the platform's roots.
    public var isSystem: Bool { source == .system }

    public var description: String {
        switch source {
        case .system: "the system's trust store"
        case .pem(_, let origin): origin
        }
    }

    /// The client TLS settings trusting these roots.
    /// - Throws: ``ConnectionError/Code/invalidConfiguration`` when the PEM holds no certificate.
    package func tlsConfiguration() throws(ConnectionError) -> TLSConfiguration {
        var configuration = TLSConfiguration.makeClientConfiguration()
        guard case .pem(let bytes, let origin) = source else { return configuration }
        let certificates: [NIOSSLCertificate]
        do {
            certificates = try NIOSSLCertificate.fromPEMBytes(bytes)
        } catch {
            throw ConnectionError(.invalidConfiguration, "\(origin) is not PEM (\(error))")
        }
        guard !certificates.isEmpty else {
            throw ConnectionError(.invalidConfiguration, "\(origin) holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        }
        configuration.trustRoots = .certificates(certificates)
        return configuration
    }
}
