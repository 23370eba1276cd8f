public import Foundation
import GRDB
import OrchardSupport
import Synchronization
import OrchardFormats
public import OrchardProtocol

/// A ``CoordinatorStore`` in one SQLite file (WAL mode) through GRDB.
///
/// A report's diff goes to its own file in a spool directory beside the database (written, and with
/// ``Durability/full`` synced, before anything refers to it); the report's transaction then marks the
/// assignment reported and names that file. The running sum is folded in memory and written back every few
/// reports (``CoordinatorConfiguration/foldInterval``); the same transaction forgets the files it now includes,
/// which are deleted once it commits. A restart reads the stored sum and folds the remaining diffs again, so
/// nothing acknowledged is lost or counted twice, and files no committed row names are swept away.
///
/// Admissions and reports that arrive while a transaction runs are committed together in the next one (group
/// commit); each caller still returns only once its own row is committed.
///
/// Keeping diffs out of the database means each report is written once (SQLite's write-ahead log would write a
/// blob twice) and, as the files are usually deleted before the kernel writes them back, often not at all.
public final class SQLiteStore: CoordinatorStore {
    /// How hard SQLite pushes commits to disk.
    public struct Durability: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, Sendable, Hashable { case normal, full }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        /// `synchronous=NORMAL`: a commit survives a killed process (kill -9); the last commits can be lost on
        /// power failure.
        public static let normal = Durability(.normal)
        /// `synchronous=FULL`: every commit is fsynced; survives power failure.
        public static let full = Durability(.full)
        public var description: String { kind.rawValue }
        /// Parses `normal` or `full`.
        public init?(_ text: String) {
            guard let kind = Kind(rawValue: text.lowercased()) else { return nil }
            self.kind = kind
        }
    }

    /// Whether several coordinators in this process share the store (``init(path:durability:sharedByInstances:)``);
    /// across processes one coordinator uses a SQLite file (``DatabaseLock`` refuses a second).
    public let isShared: Bool

    private let pool: DatabasePool
    /// Each process's secure-aggregation lock (``withSecureAggregationLock(processID:_:)``).
    private let secureAggregationLocks = Mutex<[String: AsyncSemaphore]>([:])
    private let spool: DiffSpool
    private let commits: GroupCommit<BatchedWrite>

    /// Opens (creating if needed) the database at `path` and its diff spool, the directory `<path>-spool`.
    /// - Parameters:
    ///   - path: The database file.
    ///   - durability: SQLite's synchronous mode.
    ///   - sharedByInstances: Whether several coordinators in this process will share this store, admitting and
    ///     closing cycles through it as instances over PostgreSQL do (tests and in-process benchmarks).
    public init(path: String, durability: Durability = .normal, sharedByInstances: Bool = false) throws {
        isShared = sharedByInstances
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        let synchronous = durability.description.uppercased()
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = \(synchronous)")
            try db.execute(sql: "PRAGMA foreign_keys = ON")
        }
        let pool = try DatabasePool(path: path, configuration: configuration)
        self.pool = pool
        commits = GroupCommit { writes in try await Self.commit(writes, in: pool) }
        try Self.migrator.migrate(pool)
        spool = try DiffSpool(directory: URL(fileURLWithPath: path + "-spool"), sync: durability == .full)
        let referenced = try pool.read { db in
            Set(try String.fetchAll(db, sql: "SELECT diff_file FROM assignments WHERE diff_file IS NOT NULL"))
                .union(try String.fetchAll(db, sql: "SELECT words_file FROM secure_aggregation_events WHERE words_file IS NOT NULL"))
        }
        try spool.sweep(keeping: referenced)
    }

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
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
                        sample_count INTEGER, metrics TEXT, diff BLOB,
                        PRIMARY KEY (process_id, cycle, worker_id),
                        FOREIGN KEY (process_id, cycle) REFERENCES cycles(process_id, number) ON DELETE CASCADE);
                    CREATE TABLE workers (id TEXT PRIMARY KEY, subject TEXT UNIQUE, created_at REAL NOT NULL);
                    CREATE TABLE secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
                    """)
        }
        migrator.registerMigration("v2-diff-spool") { db in
            try db.execute(sql: "ALTER TABLE assignments ADD COLUMN diff_file TEXT")
        }
        // Workers belong to one process and one issuer: the same subject elsewhere is another worker. Rows from
        // before this version keep their ids (process and issuer NULL) but no device identity maps to them again.
        migrator.registerMigration("v3-worker-scope") { db in
            try db.execute(
                sql: """
                    CREATE TABLE workers_scoped (
                        id TEXT PRIMARY KEY, process_id TEXT, issuer TEXT, subject TEXT, created_at REAL NOT NULL,
                        UNIQUE (process_id, issuer, subject));
                    INSERT INTO workers_scoped (id, subject, created_at) SELECT id, subject, created_at FROM workers;
                    DROP TABLE workers;
                    ALTER TABLE workers_scoped RENAME TO workers;
                    """)
        }
        // Differential privacy: the ledger of released aggregates, and which reports were within the adaptive
        // clipping bound (counted across a crash like the running sum).
        migrator.registerMigration("v4-privacy") { db in
            try db.execute(
                sql: """
                    ALTER TABLE processes ADD COLUMN privacy_state BLOB;
                    ALTER TABLE cycles ADD COLUMN sum_unclipped INTEGER NOT NULL DEFAULT 0;
                    ALTER TABLE assignments ADD COLUMN unclipped INTEGER NOT NULL DEFAULT 0;
                    """)
        }
        // Secure aggregation: each cycle's protocol steps, replayed after a restart.
        migrator.registerMigration("v5-secure-aggregation") { db in
            try db.execute(
                sql: """
                    CREATE TABLE secure_aggregation_events (
                        process_id TEXT NOT NULL, cycle INTEGER NOT NULL, sequence INTEGER NOT NULL, body BLOB NOT NULL, words BLOB,
                        PRIMARY KEY (process_id, cycle, sequence),
                        FOREIGN KEY (process_id, cycle) REFERENCES cycles(process_id, number) ON DELETE CASCADE);
                    """)
        }
        // Several coordinator instances: each folds into its own partial sum, and a cycle is sealed before it closes.
        // A running sum stored by an earlier version becomes the default instance's partial sum.
        migrator.registerMigration("v6-partial-sums") { db in
            try db.execute(
                sql: """
                    CREATE TABLE partial_sums (
                        process_id TEXT NOT NULL, cycle INTEGER NOT NULL, instance TEXT NOT NULL, sum BLOB NOT NULL,
                        weight REAL NOT NULL, reports INTEGER NOT NULL, unclipped INTEGER NOT NULL,
                        PRIMARY KEY (process_id, cycle, instance),
                        FOREIGN KEY (process_id, cycle) REFERENCES cycles(process_id, number) ON DELETE CASCADE);
                    INSERT INTO partial_sums (process_id, cycle, instance, sum, weight, reports, unclipped)
                        SELECT process_id, number, '\(CoordinatorConfiguration.defaultInstanceID)', sum, sum_weight, sum_reports, sum_unclipped
                        FROM cycles WHERE sum IS NOT NULL AND status = 'open';
                    UPDATE cycles SET sum = NULL;
                    ALTER TABLE cycles ADD COLUMN sealed_at REAL;
                    ALTER TABLE assignments ADD COLUMN instance TEXT;
                    UPDATE assignments SET instance = '\(CoordinatorConfiguration.defaultInstanceID)' WHERE reported = 1;
                    """)
        }
        // The durable cycle history (the dashboard's): each closed cycle's participation, metrics and closing time.
        migrator.registerMigration("v7-cycle-history") { db in
            try db.execute(
                sql: """
                    ALTER TABLE cycles ADD COLUMN closed_at REAL;
                    ALTER TABLE cycles ADD COLUMN assigned INTEGER;
                    ALTER TABLE cycles ADD COLUMN reported INTEGER;
                    ALTER TABLE cycles ADD COLUMN metrics TEXT;
                    ALTER TABLE cycles ADD COLUMN published INTEGER;
                    """)
        }
        // A masked input's words go to the spool as a report's diff does (written once, not twice through the WAL);
        // rows written before keep theirs in `words`.
        migrator.registerMigration("v8-secure-words-spool") { db in
            try db.execute(sql: "ALTER TABLE secure_aggregation_events ADD COLUMN words_file TEXT")
        }
        // Server-side evaluation: a process's held-out data and each checkpoint's evaluation on it.
        migrator.registerMigration("v9-evaluation") { db in
            try db.execute(
                sql: """
                    CREATE TABLE evaluation_data (
                        process_id TEXT PRIMARY KEY REFERENCES processes(id) ON DELETE CASCADE, bytes BLOB NOT NULL, samples INTEGER NOT NULL);
                    CREATE TABLE evaluations (
                        process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, checkpoint INTEGER NOT NULL,
                        samples INTEGER NOT NULL, metrics TEXT NOT NULL, evaluated_at REAL NOT NULL, PRIMARY KEY (process_id, checkpoint));
                    """)
        }
        // Federated evaluation: devices' results per checkpoint until it is finalized, then the aggregate.
        migrator.registerMigration("v10-federated-evaluation") { db in
            try db.execute(
                sql: """
                    CREATE TABLE evaluation_results (
                        process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, checkpoint INTEGER NOT NULL, worker_id TEXT NOT NULL,
                        samples INTEGER NOT NULL, metrics TEXT NOT NULL, received_at REAL NOT NULL, PRIMARY KEY (process_id, checkpoint, worker_id));
                    CREATE TABLE federated_evaluations (
                        process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, checkpoint INTEGER NOT NULL,
                        samples INTEGER NOT NULL, devices INTEGER, metrics TEXT NOT NULL, epsilon REAL, evaluated_at REAL NOT NULL,
                        PRIMARY KEY (process_id, checkpoint));
                    """)
        }
        // Buffered aggregation: a report's staleness (its fold weight's factor, applied again on recovery).
        migrator.registerMigration("v11-buffered") { db in
            try db.execute(sql: "ALTER TABLE assignments ADD COLUMN staleness INTEGER")
        }
        // A sequence model's evaluation results: the positions their accuracy and perplexity are means over.
        migrator.registerMigration("v12-evaluation-positions") { db in
            try db.execute(sql: "ALTER TABLE evaluation_results ADD COLUMN positions INTEGER")
        }
        return migrator
    }

    private static func json(_ value: some Encodable) throws -> String {
        String(decoding: try WireCoding.encoder().encode(value), as: UTF8.self)
    }

    private static func decode<T: Decodable>(_ type: T.Type, _ text: String, _ what: String) throws -> T {
        do {
            return try WireCoding.decoder().decode(T.self, from: Data(text.utf8))
        } catch {
            throw StoreError(.corrupt, "stored \(what) cannot be decoded: \(error)")
        }
    }

    public func createProcess(_ process: StoredProcess, initialWeights: [UInt8], firstCycle: StoredCycle) async throws {
        let model = try Self.json(process.model)
        let client = try Self.json(process.clientConfig)
        let server = try Self.json(process.serverConfig)
        try await pool.write { db in
            let existing =
                try Int.fetchOne(
                    db, sql: "SELECT COUNT(*) FROM processes WHERE name = ? AND version = ?", arguments: [process.name, process.version.description]) ?? 0
            guard existing == 0 else {
                throw StoreError(.duplicate, "process '\(process.name)' version \(process.version) already exists")
            }
            try db.execute(
                sql: "INSERT INTO processes (id, name, version, model, client_config, server_config, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                arguments: [process.id, process.name, process.version.description, model, client, server, process.createdAt.timeIntervalSince1970]
            )
            try db.execute(sql: "INSERT INTO checkpoints (process_id, number, weights) VALUES (?, 0, ?)", arguments: [process.id, Data(initialWeights)])
            try db.execute(
                sql: "INSERT INTO cycles (process_id, number, checkpoint, opened_at, status) VALUES (?, ?, ?, ?, 'open')",
                arguments: [process.id, firstCycle.number, firstCycle.checkpoint, firstCycle.openedAt.timeIntervalSince1970]
            )
        }
    }

    public func processes() async throws -> [StoredProcess] {
        // Rows are decoded inside the read: `Row` is not Sendable, and returning rows would pick GRDB's
        // blocking `read` instead of the asynchronous one.
        try await pool.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM processes ORDER BY created_at, id").map { row in
                let versionText: String = row["version"]
                guard let version = SemanticVersion(versionText) else { throw StoreError(.corrupt, "stored version '\(versionText)' is invalid") }
                return StoredProcess(
                    id: row["id"], name: row["name"], version: version,
                    model: try Self.decode(ModelSpec.self, row["model"], "model"),
                    clientConfig: try Self.decode(ClientConfig.self, row["client_config"], "client config"),
                    serverConfig: try Self.decode(ServerConfig.self, row["server_config"], "server config"),
                    createdAt: Date(timeIntervalSince1970: row["created_at"]), completed: row["completed"],
                    latestCheckpoint: row["latest_checkpoint"], cyclesCompleted: row["cycles_completed"], cyclesAbandoned: row["cycles_abandoned"]
                )
            }
        }
    }

    public func deleteProcess(id: String) async throws {
        try await pool.write { db in
            try db.execute(sql: "DELETE FROM assignments WHERE process_id = ?", arguments: [id])
            try db.execute(sql: "DELETE FROM evaluation_data WHERE process_id = ?", arguments: [id])
            try db.execute(sql: "DELETE FROM evaluations WHERE process_id = ?", arguments: [id])
            try db.execute(sql: "DELETE FROM evaluation_results WHERE process_id = ?", arguments: [id])
            try db.execute(sql: "DELETE FROM federated_evaluations WHERE process_id = ?", arguments: [id])
            try db.execute(sql: "DELETE FROM processes WHERE id = ?", arguments: [id])
            guard db.changesCount == 1 else { throw StoreError(.notFound, "no process '\(id)'") }
        }
        spool.removeProcess(id)
    }

    public func checkpoint(processID: String, number: Int) async throws -> [UInt8]? {
        let data = try await pool.read { db in
            try Data.fetchOne(db, sql: "SELECT weights FROM checkpoints WHERE process_id = ? AND number = ?", arguments: [processID, number])
        }
        return data.map { [UInt8]($0) }
    }

    public func checkpointNumbers(processID: String) async throws -> [Int] {
        try await pool.read { db in
            try Int.fetchAll(db, sql: "SELECT number FROM checkpoints WHERE process_id = ? ORDER BY number", arguments: [processID])
        }
    }

    public func optimizerState(processID: String) async throws -> [UInt8]? {
        let data = try await pool.read { db in
            try Data.fetchOne(db, sql: "SELECT optimizer_state FROM processes WHERE id = ?", arguments: [processID])
        }
        return data.map { [UInt8]($0) }
    }

    public func privacyState(processID: String) async throws -> [UInt8]? {
        let data = try await pool.read { db in
            try Data.fetchOne(db, sql: "SELECT privacy_state FROM processes WHERE id = ?", arguments: [processID])
        }
        return data.map { [UInt8]($0) }
    }

    private static func status(_ text: String) throws -> StoredCycleStatus {
        guard let status = StoredCycleStatus(rawValue: text) else { throw StoreError(.corrupt, "stored cycle status '\(text)' is not open or closing") }
        return status
    }

    public func openCycle(processID: String) async throws -> RecoveredCycle? {
        try await pool.read { db in
            guard
                let row = try Row.fetchOne(
                    db, sql: "SELECT number, checkpoint, opened_at, status, sealed_at FROM cycles WHERE process_id = ? AND status IN ('open', 'closing')",
                    arguments: [processID])
            else {
                return nil
            }
            let number: Int = row["number"]
            let cycle = StoredCycle(number: number, checkpoint: row["checkpoint"], openedAt: Date(timeIntervalSince1970: row["opened_at"]))
            let assignments = try Row.fetchAll(
                db, sql: "SELECT worker_id, request_key, reported, instance, assigned_at, staleness FROM assignments WHERE process_id = ? AND cycle = ?",
                arguments: [processID, number]
            ).map {
                StoredAssignment(
                    workerID: $0["worker_id"], requestKey: $0["request_key"], reported: $0["reported"], instance: $0["instance"],
                    assignedAt: Date(timeIntervalSince1970: $0["assigned_at"]), staleness: $0["staleness"])
            }
            var sums: [String: StoredPartialSum] = [:]
            for sum in try Row.fetchAll(
                db, sql: "SELECT instance, sum, weight, reports, unclipped FROM partial_sums WHERE process_id = ? AND cycle = ?",
                arguments: [processID, number])
            {
                sums[sum["instance"]] = StoredPartialSum(
                    bytes: [UInt8](sum["sum"] as Data), weight: sum["weight"], reports: sum["reports"], unclipped: sum["unclipped"])
            }
            let sealed: Double? = row["sealed_at"]
            return RecoveredCycle(
                cycle: cycle, status: try Self.status(row["status"]), sealedAt: sealed.map { Date(timeIntervalSince1970: $0) }, assignments: assignments,
                partialSums: sums
            )
        }
    }

    public func cycleProgress(processID: String) async throws -> StoredCycleProgress? {
        try await pool.read { db in
            guard
                let row = try Row.fetchOne(
                    db,
                    sql: """
                        SELECT number, checkpoint, opened_at, status, sealed_at,
                            (SELECT COUNT(*) FROM assignments a WHERE a.process_id = c.process_id AND a.cycle = c.number) AS assigned,
                            (SELECT COUNT(*) FROM assignments a WHERE a.process_id = c.process_id AND a.cycle = c.number AND a.reported = 1) AS reported
                        FROM cycles c WHERE process_id = ? AND status IN ('open', 'closing')
                        """, arguments: [processID])
            else { return nil }
            let sealed: Double? = row["sealed_at"]
            return StoredCycleProgress(
                number: row["number"], checkpoint: row["checkpoint"], openedAt: Date(timeIntervalSince1970: row["opened_at"]),
                status: try Self.status(row["status"]),
                sealedAt: sealed.map { Date(timeIntervalSince1970: $0) }, assigned: row["assigned"], reported: row["reported"]
            )
        }
    }

    public func forEachPendingDiff(processID: String, cycle: Int, _ body: @Sendable (PendingDiff) throws -> Void) async throws {
        let spool = self.spool
        try await pool.read { db in
            let cursor = try Row.fetchCursor(
                db,
                sql: """
                    SELECT worker_id, sample_count, unclipped, diff, diff_file, instance, staleness FROM assignments
                    WHERE process_id = ? AND cycle = ? AND reported = 1 AND (diff IS NOT NULL OR diff_file IS NOT NULL)
                    """, arguments: [processID, cycle])
            while let row = try cursor.next() {
                let bytes: [UInt8]
                if let file: String = row["diff_file"] {
                    // A file a power loss left missing comes with no bytes (the caller sees it is not the model's length);
                    // one that cannot be read for another reason is an error.
                    bytes = try spool.readIfPresent(file) ?? []
                } else {
                    let diff: Data = row["diff"]
                    bytes = [UInt8](diff)
                }
                let instance: String? = row["instance"]
                try body(
                    PendingDiff(
                        workerID: row["worker_id"], sampleCount: row["sample_count"], unclipped: row["unclipped"], diff: bytes,
                        instance: instance ?? CoordinatorConfiguration.defaultInstanceID, staleness: row["staleness"]
                    ))
            }
        }
    }

    public func discardReports(processID: String, cycle: Int, workers: [String]) async throws {
        guard !workers.isEmpty else { return }
        let files = try await pool.write { db -> [String] in
            guard try String.fetchOne(db, sql: "SELECT status FROM cycles WHERE process_id = ? AND number = ?", arguments: [processID, cycle]) == "open"
            else {
                throw StoreError(.cycleClosed, "cycle \(cycle) of process \(processID) is not open")
            }
            var files: [String] = []
            for worker in workers {
                if let file = try String.fetchOne(
                    db, sql: "SELECT diff_file FROM assignments WHERE process_id = ? AND cycle = ? AND worker_id = ? AND reported = 1",
                    arguments: [processID, cycle, worker])
                {
                    files.append(file)
                }
                try db.execute(
                    sql: """
                        UPDATE assignments SET reported = 0, diff_file = NULL, diff = NULL, sample_count = NULL
                        WHERE process_id = ? AND cycle = ? AND worker_id = ? AND reported = 1
                        """, arguments: [processID, cycle, worker])
            }
            return files
        }
        for file in files { spool.remove(file) }
    }

    public func registerWorker(id: String, processID: String, issuer: String?, subject: String?, at date: Date) async throws {
        try await pool.write { db in
            // A second registration of the same identity (a concurrent first authentication) keeps the first.
            try db.execute(
                sql:
                    "INSERT INTO workers (id, process_id, issuer, subject, created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (process_id, issuer, subject) DO NOTHING",
                arguments: [id, processID, issuer, subject, date.timeIntervalSince1970])
        }
    }

    public func workerID(processID: String, issuer: String, subject: String) async throws -> String? {
        try await pool.read { db in
            try String.fetchOne(db, sql: "SELECT id FROM workers WHERE process_id = ? AND issuer = ? AND subject = ?", arguments: [processID, issuer, subject])
        }
    }

    public func workerExists(id: String) async throws -> Bool {
        try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM workers WHERE id = ?", arguments: [id]) ?? 0 } > 0
    }

    public func workerCount(processID: String) async throws -> Int {
        try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM workers WHERE process_id = ?", arguments: [processID]) ?? 0 }
    }

    public func secret(named name: String, make: @Sendable () -> [UInt8]) async throws -> [UInt8] {
        try await pool.write { db in
            if let existing = try Data.fetchOne(db, sql: "SELECT value FROM secrets WHERE name = ?", arguments: [name]) {
                return [UInt8](existing)
            }
            let value = make()
            try db.execute(sql: "INSERT INTO secrets (name, value) VALUES (?, ?)", arguments: [name, Data(value)])
            return value
        }
    }

    public func recordAssignment(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date) async throws {
        try await commits.submit(.assignment(processID: processID, cycle: cycle, workerID: workerID, requestKey: requestKey, at: date))
    }

    public func admit(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date, limit: Int, inFlightAfter: Date?) async throws
        -> StoredAdmission
    {
        try await pool.write { db in
            let status = try String.fetchOne(db, sql: "SELECT status FROM cycles WHERE process_id = ? AND number = ?", arguments: [processID, cycle])
            guard status == "open" else { throw StoreError(.cycleClosed, "cycle \(cycle) of process \(processID) is not open") }
            if let row = try Row.fetchOne(
                db, sql: "SELECT request_key, reported, instance, assigned_at FROM assignments WHERE process_id = ? AND cycle = ? AND worker_id = ?",
                arguments: [processID, cycle, workerID])
            {
                return .existing(
                    StoredAssignment(
                        workerID: workerID, requestKey: row["request_key"], reported: row["reported"], instance: row["instance"],
                        assignedAt: Date(timeIntervalSince1970: row["assigned_at"])))
            }
            let count: Int
            if let inFlightAfter {
                count =
                    try Int.fetchOne(
                        db, sql: "SELECT COUNT(*) FROM assignments WHERE process_id = ? AND cycle = ? AND reported = 0 AND assigned_at > ?",
                        arguments: [processID, cycle, inFlightAfter.timeIntervalSince1970]) ?? 0
            } else {
                count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM assignments WHERE process_id = ? AND cycle = ?", arguments: [processID, cycle]) ?? 0
            }
            guard count < limit else { return .full }
            do {
                try db.execute(
                    sql: "INSERT INTO assignments (process_id, cycle, worker_id, request_key, assigned_at) VALUES (?, ?, ?, ?, ?)",
                    arguments: [processID, cycle, workerID, requestKey, date.timeIntervalSince1970]
                )
            } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
                throw StoreError(.duplicate, "request key of worker \(workerID) is already in use")
            }
            return .admitted
        }
    }

    public func assignment(requestKey: String) async throws -> StoredKeyedAssignment? {
        try await pool.read { db in
            guard
                let row = try Row.fetchOne(
                    db,
                    sql: """
                        SELECT a.process_id, a.cycle, a.worker_id, a.reported, a.instance, a.assigned_at FROM assignments a
                        JOIN cycles c ON c.process_id = a.process_id AND c.number = a.cycle
                        WHERE a.request_key = ? AND c.status IN ('open', 'closing')
                        """, arguments: [requestKey])
            else { return nil }
            return StoredKeyedAssignment(
                processID: row["process_id"], cycle: row["cycle"],
                assignment: StoredAssignment(
                    workerID: row["worker_id"], requestKey: requestKey, reported: row["reported"], instance: row["instance"],
                    assignedAt: Date(timeIntervalSince1970: row["assigned_at"]))
            )
        }
    }

    public func stageDiff(processID: String, cycle: Int, requestKey: String) throws(StoreError) -> any StagedDiff {
        try spool.stage(process: processID, cycle: cycle, key: requestKey)
    }

    public func recordReport(_ report: ReportRecord, diff: any StagedDiff) async throws {
        guard let file = diff as? SpooledDiff, file.owner == ObjectIdentifier(spool) else {
            diff.discard()
            throw StoreError(.io, "the staged diff of report \(report.requestKey) was not staged by this store")
        }
        // The diff is on disk before the row that names it commits; if the transaction fails, the file goes.
        do {
            if spool.sync { try file.sync() }
            try await commits.submit(.report(report, file: file.name))
        } catch {
            file.discard()
            throw error
        }
    }

    /// A write that group commit may batch with others.
    enum BatchedWrite: Sendable {
        case assignment(processID: String, cycle: Int, workerID: String, requestKey: String, at: Date)
        case report(ReportRecord, file: String)
    }

    /// Commits a batch in one transaction; one item's failure (a closed cycle, a duplicate) fails only that item.
    private static func commit(_ writes: [BatchedWrite], in pool: DatabasePool) async throws -> [Result<Void, any Error>] {
        try await pool.write { db in
            var cycleOpen: [String: Bool] = [:]
            var reportedCount: [String: Int] = [:]
            /// Whether the cycle is open, read once per batch.
            func isOpen(processID: String, cycle: Int) throws -> Bool {
                let key = "\(processID)/\(cycle)"
                if let known = cycleOpen[key] { return known }
                let open =
                    try String.fetchOne(
                        db.cachedStatement(sql: "SELECT status FROM cycles WHERE process_id = ? AND number = ?"), arguments: [processID, cycle])
                    == "open"
                cycleOpen[key] = open
                return open
            }
            return writes.map { write -> Result<Void, any Error> in
                Result {
                    switch write {
                    case .assignment(let processID, let cycle, let workerID, let requestKey, let date):
                        // A batch may commit after a close queued before it (a buffer released while this admission
                        // waited): an assignment goes only into a cycle still open.
                        guard try isOpen(processID: processID, cycle: cycle) else { throw StoreError(.cycleClosed, "cycle \(cycle) is not open") }
                        // Cached: an admission burst runs this statement thousands of times a second.
                        do {
                            try db.cachedStatement(
                                sql: "INSERT INTO assignments (process_id, cycle, worker_id, request_key, assigned_at) VALUES (?, ?, ?, ?, ?)"
                            )
                            .execute(arguments: [processID, cycle, workerID, requestKey, date.timeIntervalSince1970])
                        } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
                            throw StoreError(
                                .duplicate, "worker \(workerID) or its request key already holds an assignment in cycle \(cycle): \(error.message ?? "")")
                        }
                    case .report(let report, let file):
                        guard try isOpen(processID: report.processID, cycle: report.cycle) else {
                            throw StoreError(.cycleClosed, "cycle \(report.cycle) is not open")
                        }
                        // A buffer commits at most its release's reports, whichever instances admitted them.
                        let key = "\(report.processID)/\(report.cycle)"
                        if let limit = report.releaseLimit {
                            let committed =
                                try reportedCount[key]
                                ?? Int.fetchOne(
                                    db.cachedStatement(sql: "SELECT count(*) FROM assignments WHERE process_id = ? AND cycle = ? AND reported = 1"),
                                    arguments: [report.processID, report.cycle]) ?? 0
                            reportedCount[key] = committed
                            guard committed < limit else {
                                throw StoreError(.cycleClosed, "buffer \(report.cycle) holds its \(limit) reports: it is being released")
                            }
                        }
                        try db.cachedStatement(
                            sql: """
                                UPDATE assignments SET reported = 1, sample_count = ?, metrics = ?, diff_file = ?, unclipped = ?, instance = ?, staleness = ?
                                WHERE process_id = ? AND cycle = ? AND worker_id = ? AND request_key = ? AND reported = 0
                                """
                        ).execute(arguments: [
                            report.sampleCount, report.metricsJSON, file, report.unclipped, report.instance, report.staleness, report.processID, report.cycle,
                            report.workerID, report.requestKey,
                        ])
                        guard db.changesCount == 1 else {
                            throw StoreError(.duplicate, "no unreported assignment for this worker and request key in cycle \(report.cycle)")
                        }
                        if let committed = reportedCount[key] { reportedCount[key] = committed + 1 }
                    }
                }
            }
        }
    }

    public func foldReports(processID: String, cycle: Int, instance: String, sum: StoredPartialSum, workers: [String]) async throws {
        let files = try await pool.write { db in
            let status = try String.fetchOne(db, sql: "SELECT status FROM cycles WHERE process_id = ? AND number = ?", arguments: [processID, cycle])
            guard status == "open" else { throw StoreError(.cycleClosed, "cycle \(cycle) is not open") }
            try db.execute(
                sql: """
                    INSERT INTO partial_sums (process_id, cycle, instance, sum, weight, reports, unclipped) VALUES (?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT (process_id, cycle, instance) DO UPDATE SET sum = excluded.sum, weight = excluded.weight, reports = excluded.reports,
                        unclipped = excluded.unclipped
                    """,
                arguments: [processID, cycle, instance, Data(sum.bytes), sum.weight, sum.reports, sum.unclipped]
            )
            var files: [String] = []
            for worker in workers {
                if let file = try String.fetchOne(
                    db, sql: "SELECT diff_file FROM assignments WHERE process_id = ? AND cycle = ? AND worker_id = ?", arguments: [processID, cycle, worker])
                {
                    files.append(file)
                }
                try db.execute(
                    sql: "UPDATE assignments SET diff = NULL, diff_file = NULL WHERE process_id = ? AND cycle = ? AND worker_id = ?",
                    arguments: [processID, cycle, worker])
            }
            return files
        }
        for file in files { spool.remove(file) }
    }

    public func sealCycle(processID: String, cycle: Int, at date: Date) async throws -> Bool {
        try await pool.write { db in
            let status = try String.fetchOne(db, sql: "SELECT status FROM cycles WHERE process_id = ? AND number = ?", arguments: [processID, cycle])
            switch status {
            case "open":
                try db.execute(
                    sql: "UPDATE cycles SET status = 'closing', sealed_at = ? WHERE process_id = ? AND number = ?",
                    arguments: [date.timeIntervalSince1970, processID, cycle]
                )
                return true
            case "closing":
                return false
            default:
                throw StoreError(.cycleClosed, "cycle \(cycle) of process \(processID) is closed")
            }
        }
    }

    public func closeCycle(_ closure: CycleClosure) async throws {
        try await pool.write { db in
            let aggregated = closure.checkpoint != nil
            if let latest = try Int.fetchOne(db, sql: "SELECT latest_checkpoint FROM processes WHERE id = ?", arguments: [closure.processID]),
                let refusal = closure.staleBase(latest: latest)
            {
                throw refusal
            }
            try db.execute(
                sql: "UPDATE cycles SET status = ?, sum = NULL WHERE process_id = ? AND number = ? AND status IN ('open', 'closing')",
                arguments: [aggregated ? "aggregated" : "abandoned", closure.processID, closure.closedCycle]
            )
            guard db.changesCount == 1 else { throw StoreError(.cycleClosed, "cycle \(closure.closedCycle) is not open") }
            // The history record, from the assignment rows about to be deleted.
            let counts = try Row.fetchOne(
                db, sql: "SELECT COUNT(*) AS assigned, COALESCE(SUM(reported), 0) AS reported FROM assignments WHERE process_id = ? AND cycle = ?",
                arguments: [closure.processID, closure.closedCycle]
            )
            let metrics = try String.fetchAll(
                db, sql: "SELECT metrics FROM assignments WHERE process_id = ? AND cycle = ? AND reported = 1 AND metrics IS NOT NULL",
                arguments: [closure.processID, closure.closedCycle]
            )
            try db.execute(
                sql: "UPDATE cycles SET closed_at = ?, assigned = ?, reported = ?, metrics = ?, published = ? WHERE process_id = ? AND number = ?",
                arguments: [
                    closure.closedAt?.timeIntervalSince1970, counts?["assigned"] as Int? ?? 0, counts?["reported"] as Int? ?? 0,
                    CycleRecordSummary.json(CycleRecordSummary.means(metrics)), closure.checkpoint?.number, closure.processID, closure.closedCycle,
                ]
            )
            try db.execute(sql: "DELETE FROM partial_sums WHERE process_id = ? AND cycle = ?", arguments: [closure.processID, closure.closedCycle])
            let carryOverAfter = closure.nextCycle == nil ? nil : closure.carryOverAfter
            if let carryOverAfter {
                // Buffered: the devices still training keep their assignments, moved into the next buffer below.
                try db.execute(
                    sql: "DELETE FROM assignments WHERE process_id = ? AND cycle = ? AND NOT (reported = 0 AND assigned_at > ?)",
                    arguments: [closure.processID, closure.closedCycle, carryOverAfter.timeIntervalSince1970])
            } else {
                try db.execute(sql: "DELETE FROM assignments WHERE process_id = ? AND cycle = ?", arguments: [closure.processID, closure.closedCycle])
            }
            try db.execute(
                sql: "DELETE FROM secure_aggregation_events WHERE process_id = ? AND cycle = ?", arguments: [closure.processID, closure.closedCycle])
            if let checkpoint = closure.checkpoint {
                try db.execute(
                    sql: "INSERT INTO checkpoints (process_id, number, weights) VALUES (?, ?, ?)",
                    arguments: [closure.processID, checkpoint.number, Data(checkpoint.weights)])
                try db.execute(
                    sql: "DELETE FROM checkpoints WHERE process_id = ? AND number <= ?",
                    arguments: [closure.processID, checkpoint.number - max(1, closure.retention)]
                )
                try db.execute(
                    sql:
                        "UPDATE processes SET latest_checkpoint = ?, cycles_completed = cycles_completed + 1, optimizer_state = ?, privacy_state = ? WHERE id = ?",
                    arguments: [checkpoint.number, closure.optimizerState.map { Data($0) }, closure.privacyState.map { Data($0) }, closure.processID]
                )
            } else {
                try db.execute(sql: "UPDATE processes SET cycles_abandoned = cycles_abandoned + 1 WHERE id = ?", arguments: [closure.processID])
            }
            if let next = closure.nextCycle {
                try db.execute(
                    sql: "INSERT INTO cycles (process_id, number, checkpoint, opened_at, status) VALUES (?, ?, ?, ?, 'open')",
                    arguments: [closure.processID, next.number, next.checkpoint, next.openedAt.timeIntervalSince1970]
                )
                if carryOverAfter != nil {
                    try db.execute(
                        sql: "UPDATE assignments SET cycle = ? WHERE process_id = ? AND cycle = ?",
                        arguments: [next.number, closure.processID, closure.closedCycle])
                }
            } else {
                try db.execute(sql: "UPDATE processes SET completed = 1 WHERE id = ?", arguments: [closure.processID])
            }
        }
        spool.removeCycle(process: closure.processID, cycle: closure.closedCycle)
    }

    public func cycleRecords(processID: String, limit: Int) async throws -> [CycleRecord] {
        try await pool.read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT number, status, published, opened_at, closed_at, assigned, reported, metrics FROM cycles
                    WHERE process_id = ? AND status IN ('aggregated', 'abandoned') AND assigned IS NOT NULL ORDER BY number DESC LIMIT ?
                    """,
                arguments: [processID, max(0, limit)]
            ).reversed().map { row in
                CycleRecord(
                    cycle: row["number"], outcome: (row["status"] as String) == "aggregated" ? .aggregated : .abandoned,
                    assigned: row["assigned"] ?? 0, reported: row["reported"] ?? 0, checkpoint: row["published"], openedAt: row["opened_at"],
                    closedAt: row["closed_at"], metrics: CycleRecordSummary.decode(row["metrics"])
                )
            }
        }
    }

    public func setEvaluationData(processID: String, data: (bytes: [UInt8], samples: Int)?) async throws {
        try await pool.write { db in
            guard try Bool.fetchOne(db, sql: "SELECT 1 FROM processes WHERE id = ?", arguments: [processID]) != nil else {
                throw StoreError(.notFound, "no process '\(processID)'")
            }
            if let data {
                try db.execute(
                    sql: "INSERT OR REPLACE INTO evaluation_data (process_id, bytes, samples) VALUES (?, ?, ?)",
                    arguments: [processID, Data(data.bytes), data.samples])
            } else {
                try db.execute(sql: "DELETE FROM evaluation_data WHERE process_id = ?", arguments: [processID])
            }
        }
    }

    public func evaluationData(processID: String) async throws -> (bytes: [UInt8], samples: Int)? {
        try await pool.read { db in
            try Row.fetchOne(db, sql: "SELECT bytes, samples FROM evaluation_data WHERE process_id = ?", arguments: [processID]).map { row in
                ([UInt8](row["bytes"] as Data), row["samples"] as Int)
            }
        }
    }

    public func evaluationDataSize(processID: String) async throws -> (bytes: Int, samples: Int)? {
        try await pool.read { db in
            try Row.fetchOne(db, sql: "SELECT length(bytes) AS size, samples FROM evaluation_data WHERE process_id = ?", arguments: [processID]).map { row in
                (row["size"] as Int, row["samples"] as Int)
            }
        }
    }

    public func recordEvaluation(_ evaluation: CheckpointEvaluation, processID: String) async throws {
        let metrics = CycleRecordSummary.json(evaluation.metrics)
        try await pool.write { db in
            guard try Bool.fetchOne(db, sql: "SELECT 1 FROM processes WHERE id = ?", arguments: [processID]) != nil else { return }
            try db.execute(
                sql: "INSERT OR REPLACE INTO evaluations (process_id, checkpoint, samples, metrics, evaluated_at) VALUES (?, ?, ?, ?, ?)",
                arguments: [processID, evaluation.checkpoint, evaluation.samples, metrics, evaluation.evaluatedAt])
        }
    }

    public func evaluations(processID: String, limit: Int) async throws -> [CheckpointEvaluation] {
        try await pool.read { db in
            try Row.fetchAll(
                db, sql: "SELECT checkpoint, samples, metrics, evaluated_at FROM evaluations WHERE process_id = ? ORDER BY checkpoint DESC LIMIT ?",
                arguments: [processID, max(0, limit)]
            ).reversed().map { row in
                CheckpointEvaluation(
                    checkpoint: row["checkpoint"], samples: row["samples"], metrics: CycleRecordSummary.decode(row["metrics"]), evaluatedAt: row["evaluated_at"]
                )
            }
        }
    }

    public func recordEvaluationResult(_ result: StoredEvaluationResult, processID: String) async throws -> Int {
        let metrics = CycleRecordSummary.json(result.metrics)
        return try await pool.write { db in
            guard try Bool.fetchOne(db, sql: "SELECT 1 FROM processes WHERE id = ?", arguments: [processID]) != nil else {
                throw StoreError(.notFound, "no process '\(processID)'")
            }
            if try Bool.fetchOne(
                db, sql: "SELECT 1 FROM federated_evaluations WHERE process_id = ? AND checkpoint = ?", arguments: [processID, result.checkpoint]) != nil
            {
                throw StoreError(.cycleClosed, "the federated evaluation of checkpoint \(result.checkpoint) is finalized")
            }
            try db.execute(
                sql: """
                    INSERT OR IGNORE INTO evaluation_results (process_id, checkpoint, worker_id, samples, metrics, received_at, positions)
                    VALUES (?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [processID, result.checkpoint, result.workerID, result.samples, metrics, result.receivedAt, result.positions])
            guard db.changesCount == 1 else {
                throw StoreError(.duplicate, "worker '\(result.workerID)' already sent a result for checkpoint \(result.checkpoint)")
            }
            return try Int.fetchOne(
                db, sql: "SELECT count(*) FROM evaluation_results WHERE process_id = ? AND checkpoint = ?", arguments: [processID, result.checkpoint]) ?? 0
        }
    }

    public func evaluationResults(processID: String, checkpoint: Int) async throws -> [StoredEvaluationResult] {
        try await pool.read { db in
            try Self.evaluationResults(db, processID: processID, checkpoint: checkpoint)
        }
    }

    /// A checkpoint's stored results, by worker id.
    private static func evaluationResults(_ db: Database, processID: String, checkpoint: Int) throws -> [StoredEvaluationResult] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT worker_id, samples, metrics, received_at, positions FROM evaluation_results WHERE process_id = ? AND checkpoint = ?
                ORDER BY worker_id
                """,
            arguments: [processID, checkpoint]
        ).map { row in
            StoredEvaluationResult(
                checkpoint: checkpoint, workerID: row["worker_id"], samples: row["samples"], metrics: CycleRecordSummary.decode(row["metrics"]),
                receivedAt: row["received_at"], positions: row["positions"])
        }
    }

    public func pendingEvaluationCheckpoints(processID: String) async throws -> [Int] {
        try await pool.read { db in
            try Int.fetchAll(
                db, sql: "SELECT DISTINCT checkpoint FROM evaluation_results WHERE process_id = ? ORDER BY checkpoint", arguments: [processID])
        }
    }

    public func finalizeFederatedEvaluation(
        processID: String, checkpoint: Int, aggregate: @Sendable ([StoredEvaluationResult], Int) -> CheckpointEvaluation
    ) async throws -> CheckpointEvaluation? {
        try await pool.write { db in
            guard try Bool.fetchOne(db, sql: "SELECT 1 FROM processes WHERE id = ?", arguments: [processID]) != nil else { return nil }
            let deleteResults = "DELETE FROM evaluation_results WHERE process_id = ? AND checkpoint = ?"
            if try Bool.fetchOne(db, sql: "SELECT 1 FROM federated_evaluations WHERE process_id = ? AND checkpoint = ?", arguments: [processID, checkpoint])
                != nil
            {
                try db.execute(sql: deleteResults, arguments: [processID, checkpoint])
                return nil
            }
            let results = try Self.evaluationResults(db, processID: processID, checkpoint: checkpoint)
            guard !results.isEmpty else { return nil }
            let recorded = try Int.fetchOne(db, sql: "SELECT count(*) FROM federated_evaluations WHERE process_id = ?", arguments: [processID]) ?? 0
            let evaluation = aggregate(results, recorded)
            try db.execute(
                sql: """
                    INSERT INTO federated_evaluations (process_id, checkpoint, samples, devices, metrics, epsilon, evaluated_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [
                    processID, checkpoint, evaluation.samples, evaluation.devices, CycleRecordSummary.json(evaluation.metrics), evaluation.epsilon,
                    evaluation.evaluatedAt,
                ])
            try db.execute(sql: deleteResults, arguments: [processID, checkpoint])
            return evaluation
        }
    }

    public func federatedEvaluations(processID: String, limit: Int) async throws -> [CheckpointEvaluation] {
        try await pool.read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT checkpoint, samples, devices, metrics, epsilon, evaluated_at FROM federated_evaluations WHERE process_id = ?
                    ORDER BY checkpoint DESC LIMIT ?
                    """,
                arguments: [processID, max(0, limit)]
            ).reversed().map { row in
                CheckpointEvaluation(
                    checkpoint: row["checkpoint"], samples: row["samples"], metrics: CycleRecordSummary.decode(row["metrics"]),
                    evaluatedAt: row["evaluated_at"], devices: row["devices"], epsilon: row["epsilon"])
            }
        }
    }

    public func appendSecureAggregationEvent(_ event: StoredSecureAggregationEvent, processID: String, cycle: Int, reportedWorker: String?) async throws {
        // A masked input's words are in their spool file (synced with `Durability/full`) before the row naming it
        // commits; if the transaction fails, the file goes.
        var wordsFile: SpooledDiff?
        if let words = event.words {
            let file = try spool.stage(process: processID, cycle: cycle, key: "masked-\(event.sequence)")
            do {
                let written: StoreError? = words.withUnsafeBytes { bytes in
                    do throws(StoreError) { try file.write(bytes, at: 0) } catch { return error }
                    return nil
                }
                if let written { throw written }
                if spool.sync { try file.sync() }
            } catch {
                file.discard()
                throw error
            }
            wordsFile = file
        }
        do {
            try await insertSecureAggregationEvent(event, wordsFile: wordsFile?.name, processID: processID, cycle: cycle, reportedWorker: reportedWorker)
        } catch {
            wordsFile?.discard()
            throw error
        }
    }

    private func insertSecureAggregationEvent(_ event: StoredSecureAggregationEvent, wordsFile: String?, processID: String, cycle: Int, reportedWorker: String?)
        async throws
    {
        // Cached statements: every step of every device of a secure cycle runs these, one after another.
        try await pool.write { db in
            let status = try String.fetchOne(
                db.cachedStatement(sql: "SELECT status FROM cycles WHERE process_id = ? AND number = ?"), arguments: [processID, cycle])
            guard status == "open" else { throw StoreError(.cycleClosed, "cycle \(cycle) of process \(processID) is not open") }
            do {
                try db.cachedStatement(sql: "INSERT INTO secure_aggregation_events (process_id, cycle, sequence, body, words_file) VALUES (?, ?, ?, ?, ?)")
                    .execute(arguments: [processID, cycle, event.sequence, Data(event.body), wordsFile])
            } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
                throw StoreError(.duplicate, "secure-aggregation event \(event.sequence) of cycle \(cycle) exists")
            }
            if let reportedWorker {
                try db.cachedStatement(sql: "UPDATE assignments SET reported = 1 WHERE process_id = ? AND cycle = ? AND worker_id = ?")
                    .execute(arguments: [processID, cycle, reportedWorker])
                guard db.changesCount == 1 else { throw StoreError(.notFound, "worker \(reportedWorker) holds no assignment in cycle \(cycle)") }
            }
        }
    }

    public func secureAggregationEvents(processID: String, cycle: Int, from first: Int) async throws -> [StoredSecureAggregationEvent] {
        let spool = self.spool
        return try await pool.read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT sequence, body, words, words_file FROM secure_aggregation_events
                    WHERE process_id = ? AND cycle = ? AND sequence >= ? ORDER BY sequence
                    """,
                arguments: [processID, cycle, first]
            ).map { row in
                let words: [UInt8]?
                if let file: String = row["words_file"] {
                    words = try spool.read(file)
                } else {
                    words = (row["words"] as Data?).map { [UInt8]($0) }
                }
                return StoredSecureAggregationEvent(sequence: row["sequence"], body: [UInt8](row["body"] as Data), words: words)
            }
        }
    }

    /// Runs `body` holding the process's lock in this store object, which the coordinators sharing it in one process
    /// (``init(path:durability:sharedByInstances:)``) all take.
    public func withSecureAggregationLock<T: Sendable>(processID: String, _ body: @Sendable () async throws -> T) async throws -> T {
        let lock = secureAggregationLock(processID)
        await lock.wait()
        defer { lock.signal() }
        return try await body()
    }

    public func withSecureAggregationLockIfFree<T: Sendable>(processID: String, _ body: @Sendable () async throws -> T) async throws -> T? {
        let lock = secureAggregationLock(processID)
        guard lock.tryWait() else { return nil }
        defer { lock.signal() }
        return try await body()
    }

    private func secureAggregationLock(_ processID: String) -> AsyncSemaphore {
        secureAggregationLocks.withLock { locks in
            if let lock = locks[processID] { return lock }
            let lock = AsyncSemaphore(permits: 1)
            locks[processID] = lock
            return lock
        }
    }
}
