import Foundation
import OrchardCoordinator
import OrchardCoordinatorPostgres
import Testing

/// The store's connections over TLS to a real server: `.ci/run` turns TLS on in its cluster with a private CA
/// (certificate for localhost and 127.0.0.1) and names the CA in `ORCHARD_POSTGRES_CA`.
@Suite(TestDatabase.requirement) struct PostgresTLSTests {
    static let caVariable = "ORCHARD_POSTGRES_CA"

    /// The CA file; a clear failure when the server is required but the CA is not named.
    static func authority() throws -> String {
        guard let path = ProcessInfo.processInfo.environment[caVariable], FileManager.default.fileExists(atPath: path) else {
            throw TestDatabase.Unavailable(message: "\(caVariable) does not name a readable CA file; .ci/run makes one and turns TLS on in its cluster")
        }
        return path
    }

    @Test func verifyFullWithThePrivateCAConnectsByAddressAndName() async throws {
        let ca = try Self.authority()
        try await TestDatabase.withDatabase { configuration in
            for host in ["127.0.0.1", "localhost"] {
                var secure = configuration
                secure.host = host
                secure.tlsMode = .verifyFull
                secure.rootCertificatePath = ca
                let store = try await PostgresStore.open(configuration: secure, logger: TestDatabase.logger)
                #expect(try await store.processes().isEmpty, "\(host)")
                await store.shutdown()
            }
            var encrypted = configuration
            encrypted.tlsMode = .require
            let store = try await PostgresStore.open(configuration: encrypted, logger: TestDatabase.logger)
            #expect(try await store.workerCount(processID: "none") == 0)
            await store.shutdown()
        }
    }

    @Test func verifyFullRefusesAServerItCannotVerify() async throws {
        _ = try Self.authority()
        try await TestDatabase.withDatabase { configuration in
            // The system's roots do not include the private CA.
            var unverifiable = configuration
            unverifiable.tlsMode = .verifyFull
            unverifiable.rootCertificatePath = nil
            let error = await #expect(throws: StoreError.self) {
                _ = try await PostgresStore.open(configuration: unverifiable, logger: TestDatabase.logger)
            }
            #expect(error?.code == .io)
        }
    }
}
