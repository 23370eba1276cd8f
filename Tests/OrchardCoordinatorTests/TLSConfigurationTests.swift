import Foundation
import OrchardCoordinator
import OrchardProtocol
import OrchardTesting
import Testing

@Suite("The coordinator's TLS identity: PEM files checked before the server listens")
struct TLSConfigurationTests {
    func directory() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-tls-files-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    @Test func aMatchingCertificateAndKeyLoad() throws {
        let directory = try directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let files = try TestCertificates.make().write(to: directory)
        _ = try CoordinatorTLS.load(certificateFile: files.certificate, privateKeyFile: files.key)
    }

    @Test func badFilesAreRefusedNamingTheFileButNeverTheKeysContent() throws {
        let directory = try directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let files = try TestCertificates.make().write(to: directory)
        let other = try TestCertificates.make().write(to: directory.appendingPathComponent("other"))
        let garbage = directory.appendingPathComponent("garbage.pem")
        try Data("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n".utf8).write(to: garbage)
        let empty = directory.appendingPathComponent("empty.pem")
        try Data().write(to: empty)
        let missing = directory.appendingPathComponent("missing.pem").path
        let cases: [(certificate: String, key: String, mentions: String)] = [
            (missing, files.key, "'\(missing)': no such file"),
            (files.certificate, missing, "'\(missing)': no such file"),
            (directory.path, files.key, "is a directory"),
            (garbage.path, files.key, "certificate file '\(garbage.path)' is not a PEM certificate chain"),
            (empty.path, files.key, "certificate file '\(empty.path)' holds no PEM certificate"),
            (files.certificate, garbage.path, "private key file '\(garbage.path)' is not an unencrypted PEM private key"),
            // The certificate where the key should be, and a key of another certificate.
            (files.certificate, files.certificate, "is not an unencrypted PEM private key"),
            (files.certificate, other.key, "does not match the certificate"),
        ]
        let key = try String(contentsOfFile: files.key, encoding: .utf8)
        for (certificate, keyFile, mentions) in cases {
            let error = #expect(throws: CoordinatorError.self) { try CoordinatorTLS.load(certificateFile: certificate, privateKeyFile: keyFile) }
            #expect(error?.code == .invalidConfiguration)
            #expect(error?.message.contains(mentions) == true, "\(error?.message ?? "") should mention \(mentions)")
            let body = key.split(separator: "\n").dropFirst().first.map(String.init) ?? key
            #expect(error?.message.contains(body) == false)
        }
    }
}
