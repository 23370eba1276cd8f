import Foundation
import OrchardCoordinator
import OrchardTesting
import Testing

/// A database written by the schema before workers were scoped (v2) opens, migrates and stays readable.
@Suite struct StoreMigrationTests {
    static let sqlite3 = "/usr/bin/sqlite3"

    /// The v1 and v2 schema as GRDB's migrator left it, with one worker tied to a subject.
    static let version2 = """
        CREATE TABLE grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY);
        INSERT INTO grdb_migrations VALUES ('v1'), ('v2-diff-spool');
        CREATE TABLE processes (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, version TEXT NOT NULL, model TEXT NOT NULL,
            client_config TEXT NOT NULL, server_config TEXT NOT NULL, created_at REAL NOT NULL,
            completed INTEGER NOT NULL DEFAULT 0, latest_checkpoint INTEGER NOT NULL DEFAULT 0,
            cycles_completed INTEGER NOT NULL DEFAULT 0, cycles_abandoned INTEGER NOT NULL DEFAULT 0,
            optimizer_state BLOB, UNIQUE (name, version));
        CREATE TABLE checkpoints (
            process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, number INTEGER NOT NULL,
            weights BLOB NOT NULL, PRIMARY KEY (process_id, number));
        CREATE TABLE cycles (
            process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, number INTEGER NOT NULL,
            checkpoint INTEGER NOT NULL, opened_at REAL NOT NULL, status TEXT NOT NULL,
            sum BLOB, sum_weight REAL NOT NULL DEFAULT 0, sum_reports INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (process_id, number));
        CREATE TABLE assignments (
            process_id TEXT NOT NULL, cycle INTEGER NOT NULL, worker_id TEXT NOT NULL,
            request_key TEXT NOT NULL UNIQUE, assigned_at REAL NOT NULL, reported INTEGER NOT NULL DEFAULT 0,
            sample_count INTEGER, metrics TEXT, diff BLOB, diff_file TEXT,
            PRIMARY KEY (process_id, cycle, worker_id),
            FOREIGN KEY (process_id, cycle) REFERENCES cycles(process_id, number) ON DELETE CASCADE);
        CREATE TABLE workers (id TEXT PRIMARY KEY, subject TEXT UNIQUE, created_at REAL NOT NULL);
        CREATE TABLE secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
        INSERT INTO workers VALUES ('w_legacy', 'device-42', 0);
        """

    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: sqlite3), "needs the sqlite3 shell to write the old schema"))
    func aVersion2StoreMigratesToScopedWorkers() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-migrate-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("old.sqlite").path
        let shell = ChildProcess()
        shell.executableURL = URL(fileURLWithPath: Self.sqlite3)
        shell.arguments = [path, Self.version2]
        try shell.run()
        await shell.exited()
        #expect(shell.terminationStatus == 0)

        let store = try SQLiteStore(path: path)
        // The old worker is still there, but its unscoped subject no longer names it.
        #expect(try await store.workerExists(id: "w_legacy"))
        #expect(try await store.workerID(processID: "p", issuer: "", subject: "device-42") == nil)
        // The same subject registers in two processes and under two issuers without colliding.
        try await store.registerWorker(id: "w_p", processID: "p", issuer: "", subject: "device-42", at: Date(timeIntervalSince1970: 1))
        try await store.registerWorker(id: "w_q", processID: "q", issuer: "", subject: "device-42", at: Date(timeIntervalSince1970: 1))
        try await store.registerWorker(id: "w_p2", processID: "p", issuer: "other", subject: "device-42", at: Date(timeIntervalSince1970: 1))
        #expect(try await store.workerID(processID: "p", issuer: "", subject: "device-42") == "w_p")
        #expect(try await store.workerID(processID: "q", issuer: "", subject: "device-42") == "w_q")
        #expect(try await store.workerID(processID: "p", issuer: "other", subject: "device-42") == "w_p2")
        // But one identity of one process and issuer is one worker: a second registration (a concurrent first
        // authentication) keeps the first.
        try await store.registerWorker(id: "w_dup", processID: "p", issuer: "", subject: "device-42", at: Date(timeIntervalSince1970: 2))
        #expect(try await store.workerID(processID: "p", issuer: "", subject: "device-42") == "w_p")
        #expect(try await !store.workerExists(id: "w_dup"))
    }
}
