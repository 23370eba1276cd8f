import Foundation
#if canImport(Glibc)
import Glibc
#endif
import OrchardCoordinator
import OrchardCoordinatorPostgres
import OrchardTesting
import Synchronization
import Testing

/// What only the PostgreSQL store has: migrations, several instances starting at once, connection failures.
@Suite(TestDatabase.requirement)
struct PostgresStoreTests {
    typealias F = ContractFixture

    @Test func migrationsApplyOnceAndASecondOpenChangesNothing() async throws {
        try await TestDatabase.withDatabase { configuration in
            let first = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            #expect(try await first.appliedMigrations() == PostgresStore.schemaVersions)
            try await F.host(first)
            await first.shutdown()

            let second = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            #expect(try await second.appliedMigrations() == PostgresStore.schemaVersions)
            #expect(try await second.processes().map(\.id) == ["p"])
            await second.shutdown()
        }
    }

    @Test func severalInstancesOpeningAFreshDatabaseAtOnceAllSucceed() async throws {
        try await TestDatabase.withDatabase { configuration in
            let stores = try await withThrowingTaskGroup(of: PostgresStore.self) { group in
                for _ in 0..<4 {
                    group.addTask { try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger) }
                }
                var all: [PostgresStore] = []
                for try await store in group { all.append(store) }
                return all
            }
            #expect(stores.count == 4)
            for store in stores {
                #expect(try await store.appliedMigrations() == PostgresStore.schemaVersions)
            }
            try await F.host(stores[0])
            #expect(try await stores[3].processes().count == 1)
            for store in stores { await store.shutdown() }
        }
    }

    @Test func aWrongPasswordIsAnIOErrorThatDoesNotShowIt() async throws {
        let admin = try TestDatabase.adminConfiguration()
        var configuration = admin
        configuration.password = "not-the-Password-42"
        let error = try await #require(throws: StoreError.self) {
            _ = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
        }
        #expect(error.code == .io)
        #expect(error.message.contains("\(admin.host):\(admin.port)"))
        #expect(!error.message.contains("not-the-Password-42"))
        #expect(error.message.lowercased().contains("password") || error.message.contains("28P01"), "\(error.message)")
    }

    @Test func requiringTLSFromAServerWithoutItFailsClearly() async throws {
        var configuration = try TestDatabase.adminConfiguration()
        guard configuration.tlsMode != .require && configuration.tlsMode != .verifyFull else { return }
        configuration.tlsMode = .require
        do {
            let store = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            // The server offers TLS: then the encrypted connection works.
            #expect(try await store.workerCount(processID: "none") == 0)
            await store.shutdown()
        } catch let error as StoreError {
            #expect(error.code == .io)
            #expect(error.message.contains("TLS"), "\(error.message)")
        }
    }

    @Test func aStoreThatIsShutDownRefusesWorkAndLeavesNoStagedFiles() async throws {
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-spool-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: spool) }
        try await TestDatabase.withDatabase { base in
            var configuration = base
            configuration.spoolDirectory = spool.path
            let store = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            try await F.host(store)
            try await F.assign(store, 0..<3)
            func staged() throws -> [String] {
                // Files anywhere under the spool directory (the store's folder, then process and cycle folders).
                let names = FileManager.default.enumerator(atPath: spool.path)?.compactMap { $0 as? String } ?? []
                return names.filter { name in
                    var isDirectory: ObjCBool = false
                    return FileManager.default.fileExists(atPath: spool.appendingPathComponent(name).path, isDirectory: &isDirectory) && !isDirectory.boolValue
                }
            }
            let pendingUpload = try store.stageDiff(processID: "p", cycle: 1, requestKey: "k2")
            #expect(try staged().count == 1)
            try await store.recordReport(F.report(0), bytes: F.diff(0))
            #expect(try await storeErrorCode { try await store.recordReport(F.report(0), bytes: F.diff(1)) } == .duplicate)
            #expect(try staged().count == 1)
            pendingUpload.discard()
            pendingUpload.discard()
            #expect(try staged().isEmpty)

            await store.shutdown()
            #expect(try FileManager.default.contentsOfDirectory(atPath: spool.path).isEmpty)
            let started = ContinuousClock.now
            let error = try await #require(throws: StoreError.self) { _ = try await store.processes() }
            #expect(error.code == .io)
            #expect(ContinuousClock.now - started < .seconds(5))
            await store.shutdown()
        }
    }

    @Test func aDiffStagedByAnotherStoreIsRefused() async throws {
        try await TestDatabase.withDatabase { configuration in
            let store = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            let other = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            try await F.host(store)
            try await F.assign(store, 0..<1)
            let foreign = try other.stageDiff(processID: "p", cycle: 1, requestKey: "k0")
            #expect(try await storeErrorCode { try await store.recordReport(F.report(0), diff: foreign) } == .io)
            #expect(try await PendingCollector.pending(store).isEmpty)
            await store.shutdown()
            await other.shutdown()
        }
    }

    @Test func largeDiffsRoundTrip() async throws {
        try await withStores(.postgres) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<1)
            let diff = (0..<(4 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 7) }
            try await stores.main.recordReport(F.report(0), bytes: diff)
            #expect(try await PendingCollector.pending(stores.peer).first?.diff == diff)
        }
    }
}

/// Connection failures that need no server.
@Suite struct PostgresConnectionFailureTests {
    @Test func anUnreachableServerIsAnIOErrorWithoutThePassword() async throws {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let configuration = try PostgresStoreConfiguration(url: "postgres://orchard:s3cret-value@127.0.0.1:1/orchard?sslmode=disable&connect_timeout=5")
        let error = try await #require(throws: StoreError.self) {
            _ = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
        }
        #expect(error.code == .io)
        #expect(error.message.contains("cannot connect to PostgreSQL at 127.0.0.1:1/orchard as orchard"), "\(error.message)")
        #expect(!error.message.contains("s3cret-value"))
        #expect(!"\(error)".contains("s3cret-value"))
    }

    @Test func aMissingRootCertificateIsNamed() async throws {
        let configuration = try PostgresStoreConfiguration(url: "postgres://orchard@127.0.0.1:1/orchard?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
        let error = try await #require(throws: StoreError.self) {
            _ = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
        }
        #expect(error.code == .io)
        #expect(error.message.contains("/nonexistent/ca.pem"), "\(error.message)")
    }
}

/// The secure-aggregation lock of a coordinator that dies is released: PostgreSQL ends a session whose client is gone,
/// and its advisory locks with it. The holder here is a `psql` session (the lock taken as the store takes it), killed
/// with SIGKILL while a store waits for the lock.
@Suite(TestDatabase.requirement, .timeLimit(.minutes(2))) struct SecureAggregationLockTests {
    /// `psql` on the test database, reading statements from a pipe; the password in the environment, never on argv.
    final class Session: @unchecked Sendable {
        let process = ChildProcess()
        let input = Pipe()
        let output = Pipe()
        var buffer = Data()

        init(_ configuration: PostgresStoreConfiguration) throws {
            guard FileManager.default.isExecutableFile(atPath: "/usr/bin/psql") else {
                throw MultiProcessTests.Failure("this test needs psql (Debian's postgresql-client), which .ci/run installs with the server")
            }
            process.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
            process.arguments = [
                "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                "host=\(configuration.host) port=\(configuration.port) user=\(configuration.user) dbname=\(configuration.database) sslmode=disable",
            ]
            var environment = ProcessInfo.processInfo.environment
            environment["PGPASSWORD"] = configuration.password ?? ""
            process.environment = environment
            process.standardInput = input
            process.standardOutput = output
            try process.run()
        }

        /// Sends `sql` and returns what it printed before the marker echoed after it.
        func run(_ sql: String) async throws -> String {
            input.fileHandleForWriting.write(Data("\(sql)\n\\echo --end--\n".utf8))
            while true {
                if let range = buffer.range(of: Data("--end--\n".utf8)) {
                    let text = String(decoding: buffer[..<range.lowerBound], as: UTF8.self)
                    buffer.removeSubrange(..<range.upperBound)
                    return text.trimmingCharacters(in: .whitespacesAndNewlines)
                }
                let chunk = await output.fileHandleForReading.nextAvailableData()
                guard !chunk.isEmpty else { throw MultiProcessTests.Failure("psql ended: \(String(decoding: buffer, as: UTF8.self))") }
                buffer.append(chunk)
            }
        }

        func kill9() async {
            kill(process.processIdentifier, SIGKILL)
            await process.exited()
        }
    }

    @Test func aDeadHoldersLockIsReleasedToTheWaitingInstance() async throws {
        try await TestDatabase.withDatabase { configuration in
            let store = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            let holder = try Session(configuration)
            let key = "\(PostgresStore.secureAggregationLockClass), hashtext('p')"
            _ = try await holder.run("SELECT pg_advisory_lock(\(key));")
            let entered = Mutex(false)
            let waiter = Task {
                try await store.withSecureAggregationLock(processID: "p") { entered.withLock { $0 = true } }
            }
            // Wait (by asking the server, not the clock) until the store is queued behind the holder.
            var waiting = false
            for _ in 0..<2000 where !waiting {
                waiting =
                    try await holder.run(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = \(PostgresStore.secureAggregationLockClass) AND NOT granted;")
                    == "1"
                if !waiting { await Task.yield() }
            }
            #expect(waiting, "the store waits for the lock")
            #expect(!entered.withLock { $0 }, "not while the holder lives")
            await holder.kill9()
            try await waiter.value
            #expect(entered.withLock { $0 }, "the dead holder's lock went to the waiting store")
            await store.shutdown()
        }
    }
}
