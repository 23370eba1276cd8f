public import Foundation
public import Logging
public import OrchardCoordinator
import NIOCore
import NIOSSL
import OrchardFormats
public import OrchardProtocol
import OrchardSupport
import PostgresNIO
import Synchronization

/// A ``OrchardCoordinator/CoordinatorStore`` in PostgreSQL, shared by several coordinator instances.
///
/// Open it with ``open(configuration:logger:)``, which connects once (failing fast with
/// ``OrchardCoordinator/StoreError/Code/io`` when the server cannot be reached), applies the schema's migrations
/// under an advisory lock, and starts a connection pool (postgres-nio's `PostgresClient`) whose background task the
/// store owns. Call ``shutdown()`` when done: it stops that task, closes the connections and deletes the staging
/// directory; a store that is not shut down keeps its connections until the process exits.
///
/// Every method is one transaction at READ COMMITTED with explicit row locks on the cycle: admissions lock it
/// `FOR UPDATE` (so concurrent admissions across instances respect the limit exactly); reports, folds and
/// secure-aggregation steps lock it `FOR SHARE` (a buffered process's report `FOR UPDATE`, so that its count of the
/// buffer's reports is exact) and require it open, so sealing (an UPDATE of that row) waits for
/// them and nothing commits into a sealed cycle; closing updates it only from 'open' or 'closing', exactly once.
///
/// A report's diff is staged in a temporary file while it arrives (memory stays bounded) and written to the
/// assignment's BYTEA column in the report's transaction; once that commits it is durable.
public final class PostgresStore: FoldingStore {
    private let client: PostgresClient
    private let runner: Task<Void, Never>
    /// The connections that hold secure-aggregation locks (``withSecureAggregationLock(processID:_:)``): a pool apart
    /// from the one queries use, so a held lock never takes the connection its holder's queries need.
    private let locks: PostgresClient
    private let locksRunner: Task<Void, Never>
    private let logger: Logger
    private let spool: StagingSpool
    private let configuration: PostgresStoreConfiguration
    /// The connection holding this instance's id (``claimInstance(_:)``), closed by ``shutdown()``.
    private let claim = Mutex<PostgresConnection?>(nil)

    /// At most this many secure-aggregation locks are held or awaited at once by one store (one per process at a
    /// time, as the coordinator serialises each process's steps).
    public static let lockConnections = 4

    /// True: several coordinator instances may share this store.
    public var isShared: Bool { true }

    private init(
        client: PostgresClient, runner: Task<Void, Never>, locks: PostgresClient, locksRunner: Task<Void, Never>, logger: Logger, spool: StagingSpool,
        configuration: PostgresStoreConfiguration
    ) {
        self.configuration = configuration
        self.client = client
        self.runner = runner
        self.locks = locks
        self.locksRunner = locksRunner
        self.logger = logger
        self.spool = spool
    }

    deinit {
        runner.cancel()
        locksRunner.cancel()
    }

    /// Connects, applies pending schema migrations and starts the connection pool. Throws
    /// ``OrchardCoordinator/StoreError/Code/io`` when the server cannot be reached or refuses the login.
    public static func open(configuration: PostgresStoreConfiguration, logger: Logger = Logger(label: "orchard.postgres")) async throws -> PostgresStore {
        let target = Self.place(configuration)
        let tls = try tlsConfiguration(configuration)

        // One direct connection first: it fails at once when the server is unreachable (the pool would retry for a
        // minute), and runs the migrations.
        let connection = try await connect(configuration, logger: logger)
        do {
            let applied = try await PostgresSchema.migrate(connection, logger: logger)
            if !applied.isEmpty {
                logger.info(
                    "applied PostgreSQL schema migrations", metadata: ["versions": "\(applied.joined(separator: ", "))", "database": "\(configuration)"])
            }
        } catch {
            try? await connection.close()
            throw StoreError(.io, "cannot apply the schema migrations to PostgreSQL at \(target): \(PostgresErrors.detail(error))")
        }
        try? await connection.close()

        let spool = try StagingSpool(root: configuration.spoolDirectory)
        var pooled = PostgresClient.Configuration(
            host: configuration.host, port: configuration.port, username: configuration.user, password: configuration.password,
            database: configuration.database, tls: .disable
        )
        switch (configuration.tlsMode, tls) {
        case (.disable, _), (_, nil): pooled.tls = .disable
        case (.prefer, let tls?): pooled.tls = .prefer(tls)
        case (_, let tls?): pooled.tls = .require(tls)
        }
        pooled.options.maximumConnections = configuration.poolSize
        pooled.options.minimumConnections = 0
        pooled.options.connectTimeout = .nanoseconds(configuration.connectTimeout.inNanoseconds)
        // Exact admission and the seal's checks rely on READ COMMITTED (each statement sees what committed before it ran):
        // set it for every session, whatever the server's or the role's default.
        pooled.options.additionalStartupParameters = [("default_transaction_isolation", "read committed")]
        let client = PostgresClient(configuration: pooled, backgroundLogger: logger)
        let runner = Task { await client.run() }
        pooled.options.maximumConnections = lockConnections
        // A lock held by a session whose host went away is kept until the server notices: a device's step waits for it
        // at most this long, then fails (and is retried), rather than holding a lock connection for hours.
        pooled.options.additionalStartupParameters.append(("lock_timeout", "\(Self.lockTimeoutSeconds)s"))
        let locks = PostgresClient(configuration: pooled, backgroundLogger: logger)
        let locksRunner = Task { await locks.run() }
        logger.debug("opened PostgreSQL store", metadata: ["database": "\(configuration)"])
        return PostgresStore(
            client: client, runner: runner, locks: locks, locksRunner: locksRunner, logger: logger, spool: spool, configuration: configuration)
    }

    /// The server, database and user, without the password.
    private static func place(_ configuration: PostgresStoreConfiguration) -> String {
        "\(configuration.host):\(configuration.port)/\(configuration.database) as \(configuration.user)"
    }

    /// One connection outside the pool (migrations, administration), or ``OrchardCoordinator/StoreError/Code/io``
    /// saying why not.
    static func connect(_ configuration: PostgresStoreConfiguration, logger: Logger) async throws -> PostgresConnection {
        let target = Self.place(configuration)
        if let problem = configuration.problem { throw StoreError(.io, "cannot use PostgreSQL at \(target): \(problem)") }
        var direct = PostgresConnection.Configuration(
            host: configuration.host, port: configuration.port, username: configuration.user, password: configuration.password,
            database: configuration.database, tls: .disable
        )
        direct.options.connectTimeout = .nanoseconds(configuration.connectTimeout.inNanoseconds)
        do {
            switch (configuration.tlsMode, try tlsConfiguration(configuration)) {
            case (.disable, _), (_, nil): direct.tls = .disable
            case (.prefer, let tls?): direct.tls = .prefer(try NIOSSLContext(configuration: tls))
            case (_, let tls?): direct.tls = .require(try NIOSSLContext(configuration: tls))
            }
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError(.io, "cannot set up TLS for PostgreSQL at \(target): \(error)")
        }
        do {
            return try await PostgresConnection.connect(configuration: direct, id: 0, logger: logger)
        } catch {
            throw StoreError(.io, "cannot connect to PostgreSQL at \(target) (sslmode=\(configuration.tlsMode.rawValue)): \(PostgresErrors.detail(error))")
        }
    }

    /// The schema versions applied to the database, in the order they were applied.
    public func appliedMigrations() async throws -> [String] {
        let what = "list the applied schema migrations"
        let rows = try await rows(what, "SELECT version FROM orchard_schema_migrations ORDER BY applied_at, version")
        do { return try rows.map { try $0.decode(String.self) } } catch { throw PostgresErrors.map(error, what) }
    }

    /// Every schema version this build knows, oldest first (all are applied by ``open(configuration:logger:)``).
    public static var schemaVersions: [String] { PostgresSchema.migrations.map(\.version) }

    /// Stops the connection pool (closing its connections; later calls fail with
    /// ``OrchardCoordinator/StoreError/Code/io``) and deletes the staging directory. Calling it again does nothing.
    public func shutdown() async {
        if let held = claim.withLock({ held in
            defer { held = nil }; return held
        }) {
            try? await held.close()
        }
        runner.cancel()
        locksRunner.cancel()
        await runner.value
        await locksRunner.value
        spool.remove()
    }

    /// The TLS settings `sslmode` asks for, or nil for plain TCP.
    private static func tlsConfiguration(_ configuration: PostgresStoreConfiguration) throws -> TLSConfiguration? {
        var tls = TLSConfiguration.makeClientConfiguration()
        switch configuration.tlsMode {
        case .disable:
            return nil
        case .prefer, .require:
            // Encrypted, not authenticated: libpq's prefer and require do not verify the certificate either.
            tls.certificateVerification = .none
        case .verifyFull:
            tls.certificateVerification = .fullVerification
            if let path = configuration.rootCertificatePath {
                do {
                    tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(path))
                } catch {
                    throw StoreError(.io, "cannot read sslrootcert \(path) (a PEM file of trusted certificate authorities): \(error)")
                }
            }
        }
        return tls
    }

    // MARK: - Plumbing

    /// Runs `body` in a transaction on a pooled connection, mapping errors to ``StoreError`` (`what` names the operation).
    private func transaction<T: Sendable>(
        _ what: @autoclosure () -> String, readOnly: Bool = false, _ body: (PostgresConnection) async throws -> T
    ) async throws -> T {
        let logger = self.logger
        do {
            return try await client.withConnection { connection async throws -> T in
                try await connection.rows(readOnly ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" : "BEGIN", logger: logger)
                do {
                    let value = try await body(connection)
                    try await connection.rows("COMMIT", logger: logger)
                    return value
                } catch {
                    _ = try? await connection.rows("ROLLBACK", logger: logger)
                    throw error
                }
            }
        } catch {
            throw PostgresErrors.map(error, what())
        }
    }

    /// Runs one statement outside an explicit transaction and returns its rows.
    @discardableResult
    private func rows(_ what: @autoclosure () -> String, _ query: PostgresQuery) async throws -> [PostgresRow] {
        do {
            return try await client.query(query, logger: logger).collect()
        } catch {
            throw PostgresErrors.map(error, what())
        }
    }

    @discardableResult
    private func run(_ connection: PostgresConnection, _ query: PostgresQuery) async throws -> [PostgresRow] {
        try await connection.query(query, logger: logger).collect()
    }

    private static func buffer(_ bytes: [UInt8]) -> ByteBuffer { ByteBuffer(bytes: bytes) }
    private static func bytes(_ buffer: ByteBuffer) -> [UInt8] { Array(buffer.readableBytesView) }

    private static func json(_ value: some Encodable, _ what: String) throws -> String {
        do {
            return String(decoding: try WireCoding.encoder().encode(value), as: UTF8.self)
        } catch {
            throw StoreError(.corrupt, "the \(what) cannot be encoded: \(error)")
        }
    }

    private static func decode<T: Decodable>(_ type: T.Type, _ text: String, _ what: String) throws -> T {
        do {
            return try WireCoding.decoder().decode(T.self, from: Data(text.utf8))
        } catch {
            throw StoreError(.corrupt, "stored \(what) cannot be decoded: \(error)")
        }
    }

    /// Locks a cycle's row (`FOR SHARE` or `FOR UPDATE`) and returns its status, nil when absent.
    private func lockCycle(_ connection: PostgresConnection, processID: String, cycle: Int, exclusive: Bool) async throws -> String? {
        let query: PostgresQuery =
            exclusive
            ? "SELECT status FROM cycles WHERE process_id = \(processID) AND number = \(cycle) FOR UPDATE"
            : "SELECT status FROM cycles WHERE process_id = \(processID) AND number = \(cycle) FOR SHARE"
        return try await run(connection, query).first.map { try $0.decode(String.self) }
    }

    /// Throws ``StoreError/Code/cycleClosed`` unless `status` is 'open'.
    private static func requireOpen(_ status: String?, processID: String, cycle: Int) throws {
        switch status {
        case "open": return
        case "closing": throw StoreError(.cycleClosed, "cycle \(cycle) of process \(processID) is sealed for closing")
        case nil: throw StoreError(.cycleClosed, "cycle \(cycle) of process \(processID) does not exist")
        case let status?: throw StoreError(.cycleClosed, "cycle \(cycle) of process \(processID) is closed (\(status))")
        }
    }

    // MARK: - Processes and checkpoints

    public func createProcess(_ process: StoredProcess, initialWeights: [UInt8], firstCycle: StoredCycle) async throws {
        let model = try Self.json(process.model, "model")
        let client = try Self.json(process.clientConfig, "client config")
        let server = try Self.json(process.serverConfig, "server config")
        let version = process.version.description
        do {
            try await transaction("host process '\(process.name)' version \(version)") { connection in
                try await run(
                    connection,
                    """
                    INSERT INTO processes (id, name, version, model, client_config, server_config, created_at)
                    VALUES (\(process.id), \(process.name), \(version), \(model), \(client), \(server), \(process.createdAt.timeIntervalSince1970))
                    """)
                try await run(connection, "INSERT INTO checkpoints (process_id, number, weights) VALUES (\(process.id), 0, \(Self.buffer(initialWeights)))")
                try await run(
                    connection,
                    """
                    INSERT INTO cycles (process_id, number, checkpoint, opened_at, status)
                    VALUES (\(process.id), \(firstCycle.number), \(firstCycle.checkpoint), \(firstCycle.openedAt.timeIntervalSince1970), 'open')
                    """)
            }
        } catch let error as StoreError where error.code == .duplicate {
            throw StoreError(.duplicate, "process '\(process.name)' version \(version) (or id '\(process.id)') already exists")
        }
    }

    public func processes() async throws -> [StoredProcess] {
        let rows = try await rows(
            "list processes",
            """
            SELECT id, name, version, model, client_config, server_config, created_at, completed, latest_checkpoint, cycles_completed, cycles_abandoned
            FROM processes ORDER BY created_at, id
            """)
        do {
            return try rows.map { row in
                let (id, name, versionText, model, client, server, createdAt, completed, latest, aggregated, abandoned) =
                    try row.decode((String, String, String, String, String, String, Double, Bool, Int, Int, Int).self)
                guard let version = SemanticVersion(versionText) else {
                    throw StoreError(.corrupt, "stored version '\(versionText)' of process '\(id)' is invalid")
                }
                return StoredProcess(
                    id: id, name: name, version: version, model: try Self.decode(ModelSpec.self, model, "model of process '\(id)'"),
                    clientConfig: try Self.decode(ClientConfig.self, client, "client config of process '\(id)'"),
                    serverConfig: try Self.decode(ServerConfig.self, server, "server config of process '\(id)'"),
                    createdAt: Date(timeIntervalSince1970: createdAt), completed: completed, latestCheckpoint: latest,
                    cyclesCompleted: aggregated, cyclesAbandoned: abandoned
                )
            }
        } catch {
            throw PostgresErrors.map(error, "list processes")
        }
    }

    public func deleteProcess(id: String) async throws {
        // Checkpoints, cycles and (through cycles) assignments, partial sums and events cascade.
        try await transaction("delete process '\(id)'") { connection in
            guard try await !run(connection, "DELETE FROM processes WHERE id = \(id) RETURNING id").isEmpty else {
                throw StoreError(.notFound, "no process '\(id)'")
            }
        }
    }

    public func checkpoint(processID: String, number: Int) async throws -> [UInt8]? {
        let rows = try await rows(
            "read checkpoint \(number) of process '\(processID)'", "SELECT weights FROM checkpoints WHERE process_id = \(processID) AND number = \(number)")
        do {
            return try rows.first.map { Self.bytes(try $0.decode(ByteBuffer.self)) }
        } catch {
            throw PostgresErrors.map(error, "read checkpoint \(number) of process '\(processID)'")
        }
    }

    public func checkpointNumbers(processID: String) async throws -> [Int] {
        let rows = try await rows(
            "list the checkpoints of process '\(processID)'", "SELECT number FROM checkpoints WHERE process_id = \(processID) ORDER BY number")
        do {
            return try rows.map { try $0.decode(Int.self) }
        } catch {
            throw PostgresErrors.map(error, "list the checkpoints of process '\(processID)'")
        }
    }

    public func optimizerState(processID: String) async throws -> [UInt8]? {
        let rows = try await rows("read the optimizer state of process '\(processID)'", "SELECT optimizer_state FROM processes WHERE id = \(processID)")
        do {
            return try rows.first.flatMap { try $0.decode(ByteBuffer?.self) }.map(Self.bytes)
        } catch {
            throw PostgresErrors.map(error, "read the optimizer state of process '\(processID)'")
        }
    }

    public func privacyState(processID: String) async throws -> [UInt8]? {
        let rows = try await rows("read the privacy ledger of process '\(processID)'", "SELECT privacy_state FROM processes WHERE id = \(processID)")
        do {
            return try rows.first.flatMap { try $0.decode(ByteBuffer?.self) }.map(Self.bytes)
        } catch {
            throw PostgresErrors.map(error, "read the privacy ledger of process '\(processID)'")
        }
    }

    // MARK: - Cycles

    private static func status(_ text: String, cycle: Int) throws -> StoredCycleStatus {
        guard let status = StoredCycleStatus(rawValue: text) else { throw StoreError(.corrupt, "cycle \(cycle) has unexpected status '\(text)'") }
        return status
    }

    public func openCycle(processID: String) async throws -> RecoveredCycle? {
        try await transaction("read the open cycle of process '\(processID)'", readOnly: true) { connection -> RecoveredCycle? in
            guard
                let row = try await run(
                    connection,
                    """
                    SELECT number, checkpoint, opened_at, status, sealed_at FROM cycles
                    WHERE process_id = \(processID) AND status IN ('open', 'closing') ORDER BY number DESC LIMIT 1
                    """
                ).first
            else { return nil }
            let (number, checkpoint, openedAt, statusText, sealedAt) = try row.decode((Int, Int, Double, String, Double?).self)
            let assignments = try await run(
                connection,
                """
                SELECT worker_id, request_key, reported, instance, assigned_at, staleness FROM assignments
                WHERE process_id = \(processID) AND cycle = \(number) ORDER BY assigned_at, worker_id
                """
            ).map { row in
                let (worker, key, reported, instance, at, staleness) = try row.decode((String, String, Bool, String?, Double, Int?).self)
                return StoredAssignment(
                    workerID: worker, requestKey: key, reported: reported, instance: instance, assignedAt: Date(timeIntervalSince1970: at),
                    staleness: staleness)
            }
            var sums: [String: StoredPartialSum] = [:]
            for row in try await run(
                connection, "SELECT instance, sum, weight, reports, unclipped FROM partial_sums WHERE process_id = \(processID) AND cycle = \(number)")
            {
                let (instance, sum, weight, reports, unclipped) = try row.decode((String, ByteBuffer, Double, Int, Int).self)
                sums[instance] = StoredPartialSum(bytes: Self.bytes(sum), weight: weight, reports: reports, unclipped: unclipped)
            }
            return RecoveredCycle(
                cycle: StoredCycle(number: number, checkpoint: checkpoint, openedAt: Date(timeIntervalSince1970: openedAt)),
                status: try Self.status(statusText, cycle: number), sealedAt: sealedAt.map(Date.init(timeIntervalSince1970:)),
                assignments: assignments, partialSums: sums
            )
        }
    }

    public func cycleProgress(processID: String) async throws -> StoredCycleProgress? {
        let what = "read the progress of process '\(processID)'"
        let rows = try await rows(
            what,
            """
            SELECT c.number, c.checkpoint, c.opened_at, c.status, c.sealed_at,
                (SELECT COUNT(*) FROM assignments a WHERE a.process_id = c.process_id AND a.cycle = c.number),
                (SELECT COUNT(*) FROM assignments a WHERE a.process_id = c.process_id AND a.cycle = c.number AND a.reported)
            FROM cycles c WHERE c.process_id = \(processID) AND c.status IN ('open', 'closing') ORDER BY c.number DESC LIMIT 1
            """)
        do {
            guard let row = rows.first else { return nil }
            let (number, checkpoint, openedAt, status, sealedAt, assigned, reported) = try row.decode((Int, Int, Double, String, Double?, Int, Int).self)
            return StoredCycleProgress(
                number: number, checkpoint: checkpoint, openedAt: Date(timeIntervalSince1970: openedAt), status: try Self.status(status, cycle: number),
                sealedAt: sealedAt.map(Date.init(timeIntervalSince1970:)), assigned: assigned, reported: reported
            )
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    public func forEachPendingDiff(processID: String, cycle: Int, _ body: @Sendable (PendingDiff) throws -> Void) async throws {
        let what = "read the pending diffs of cycle \(cycle) of process '\(processID)'"
        let logger = self.logger
        do {
            // Streamed row by row: one diff in memory at a time.
            try await client.withConnection { connection in
                let rows = try await connection.query(
                    """
                    SELECT worker_id, sample_count, unclipped, diff, instance, staleness FROM assignments
                    WHERE process_id = \(processID) AND cycle = \(cycle) AND reported AND diff IS NOT NULL ORDER BY worker_id
                    """, logger: logger)
                for try await row in rows {
                    let (worker, samples, unclipped, diff, instance, staleness) = try row.decode((String, Int?, Bool, ByteBuffer, String?, Int?).self)
                    try body(
                        PendingDiff(
                            workerID: worker, sampleCount: samples ?? 0, unclipped: unclipped, diff: Self.bytes(diff),
                            instance: instance ?? CoordinatorConfiguration.defaultInstanceID, staleness: staleness
                        ))
                }
            }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    // MARK: - Workers and secrets

    public func registerWorker(id: String, processID: String, issuer: String?, subject: String?, at date: Date) async throws {
        // A second registration of the same identity (a concurrent first authentication) keeps the first.
        try await rows(
            "register worker '\(id)'",
            """
            INSERT INTO workers (id, process_id, issuer, subject, created_at) VALUES (\(id), \(processID), \(issuer), \(subject), \(date.timeIntervalSince1970))
            ON CONFLICT (process_id, issuer, subject) DO NOTHING
            """)
    }

    public func workerID(processID: String, issuer: String, subject: String) async throws -> String? {
        let what = "look up a worker of process '\(processID)'"
        let rows = try await rows(what, "SELECT id FROM workers WHERE process_id = \(processID) AND issuer = \(issuer) AND subject = \(subject)")
        do { return try rows.first.map { try $0.decode(String.self) } } catch { throw PostgresErrors.map(error, what) }
    }

    public func workerExists(id: String) async throws -> Bool {
        try await !rows("look up worker '\(id)'", "SELECT 1 FROM workers WHERE id = \(id)").isEmpty
    }

    public func workerCount(processID: String) async throws -> Int {
        let what = "count the workers of process '\(processID)'"
        let rows = try await rows(what, "SELECT COUNT(*) FROM workers WHERE process_id = \(processID)")
        do { return try rows.first.map { try $0.decode(Int.self) } ?? 0 } catch { throw PostgresErrors.map(error, what) }
    }

    public func secret(named name: String, make: @Sendable () -> [UInt8]) async throws -> [UInt8] {
        let what = "read secret '\(name)'"
        func stored() async throws -> [UInt8]? {
            let rows = try await rows(what, "SELECT value FROM secrets WHERE name = \(name)")
            do { return try rows.first.map { Self.bytes(try $0.decode(ByteBuffer.self)) } } catch { throw PostgresErrors.map(error, what) }
        }
        if let existing = try await stored() { return existing }
        // Instances racing to create it: the first insert wins and every one reads that value back.
        try await rows("store secret '\(name)'", "INSERT INTO secrets (name, value) VALUES (\(name), \(Self.buffer(make()))) ON CONFLICT (name) DO NOTHING")
        guard let value = try await stored() else { throw StoreError(.io, "secret '\(name)' was stored but cannot be read back") }
        return value
    }

    // MARK: - Admissions

    public func recordAssignment(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date) async throws {
        let inserted: [PostgresRow]
        do {
            // Only into a cycle still open (an admission written after its cycle closed would be stranded there).
            inserted = try await client.query(
                """
                INSERT INTO assignments (process_id, cycle, worker_id, request_key, assigned_at)
                SELECT \(processID), \(cycle), \(workerID), \(requestKey), \(date.timeIntervalSince1970)
                WHERE EXISTS (SELECT 1 FROM cycles WHERE process_id = \(processID) AND number = \(cycle) AND status = 'open')
                RETURNING 1
                """, logger: logger
            ).collect()
        } catch let error where PostgresErrors.isUniqueViolation(error) {
            throw StoreError(
                .duplicate, "worker '\(workerID)' or request key '\(requestKey)' already holds an assignment in cycle \(cycle) of process '\(processID)'")
        } catch let error where PostgresErrors.isForeignKeyViolation(error) {
            throw StoreError(.notFound, "cycle \(cycle) of process '\(processID)' does not exist")
        } catch {
            throw PostgresErrors.map(error, "record the assignment of worker '\(workerID)' to cycle \(cycle)")
        }
        guard inserted.isEmpty else { return }
        throw StoreError(.cycleClosed, "cycle \(cycle) of process '\(processID)' is not open")
    }

    public func admit(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date, limit: Int, inFlightAfter: Date?) async throws
        -> StoredAdmission
    {
        let what = "admit worker '\(workerID)' to cycle \(cycle) of process '\(processID)'"
        // One statement (its own transaction): `orchard_admit_in_flight` locks the cycle row, which serialises every admission to
        // the cycle whichever instance makes it, then finds an existing assignment, counts, and inserts.
        let rows: [PostgresRow]
        do {
            rows = try await client.query(
                "SELECT outcome, existing_key, existing_reported, existing_instance, existing_at FROM orchard_admit_in_flight(\(processID), \(cycle), \(workerID), \(requestKey), \(date.timeIntervalSince1970), \(limit), \(inFlightAfter?.timeIntervalSince1970))",
                logger: logger
            ).collect()
        } catch let error where PostgresErrors.isUniqueViolation(error) {
            throw StoreError(.duplicate, "request key '\(requestKey)' was already issued")
        } catch {
            throw PostgresErrors.map(error, what)
        }
        guard let row = rows.first else { throw StoreError(.corrupt, "\(what): orchard_admit_in_flight returned no row") }
        let outcome: String, key: String?, reported: Bool?, instance: String?, at: Double?
        do {
            (outcome, key, reported, instance, at) = try row.decode((String, String?, Bool?, String?, Double?).self)
        } catch {
            throw PostgresErrors.map(error, what)
        }
        switch outcome {
        case "admitted": return .admitted
        case "full": return .full
        case "existing":
            guard let key, let reported else { throw StoreError(.corrupt, "\(what): an existing assignment without its key") }
            return .existing(
                StoredAssignment(
                    workerID: workerID, requestKey: key, reported: reported, instance: instance, assignedAt: at.map(Date.init(timeIntervalSince1970:))))
        case "closed": throw StoreError(.cycleClosed, "cycle \(cycle) of process '\(processID)' is not open")
        default: throw StoreError(.corrupt, "\(what): orchard_admit_in_flight answered '\(outcome)'")
        }
    }

    public func assignment(requestKey: String) async throws -> StoredKeyedAssignment? {
        let what = "look up request key '\(requestKey)'"
        let rows = try await rows(
            what,
            """
            SELECT a.process_id, a.cycle, a.worker_id, a.request_key, a.reported, a.instance, a.assigned_at
            FROM assignments a JOIN cycles c ON c.process_id = a.process_id AND c.number = a.cycle
            WHERE a.request_key = \(requestKey) AND c.status IN ('open', 'closing')
            """)
        do {
            return try rows.first.map { row in
                let (process, cycle, worker, key, reported, instance, at) = try row.decode((String, Int, String, String, Bool, String?, Double).self)
                return StoredKeyedAssignment(
                    processID: process, cycle: cycle,
                    assignment: StoredAssignment(
                        workerID: worker, requestKey: key, reported: reported, instance: instance, assignedAt: Date(timeIntervalSince1970: at)))
            }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    // MARK: - Reports

    public func stageDiff(processID: String, cycle: Int, requestKey: String) throws(StoreError) -> any StagedDiff {
        try spool.stage(processID: processID, cycle: cycle, requestKey: requestKey)
    }

    public func recordReport(_ report: ReportRecord, diff: any StagedDiff) async throws {
        // The staged file goes whatever happens: on success the diff is in the committed row.
        defer { diff.discard() }
        guard let file = diff as? SpooledDiff, spool.owns(file) else {
            throw StoreError(.io, "the staged diff of report \(report.requestKey) was not staged by this store")
        }
        let size = try file.size()
        var bytes = ByteBuffer()
        if size > 0 {
            bytes = ByteBufferAllocator().buffer(capacity: size)
            try bytes.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { raw -> Int in
                try file.read(into: UnsafeMutableRawBufferPointer(rebasing: raw[0..<size]), at: 0)
                return size
            }
        }
        let what = "record the report of key '\(report.requestKey)' in cycle \(report.cycle)"
        let outcome: String?
        do {
            outcome = try await client.query(
                """
                SELECT orchard_record_report(\(report.processID), \(report.cycle), \(report.workerID), \(report.requestKey), \(report.sampleCount),
                    \(report.metricsJSON), \(report.unclipped), \(report.instance), \(bytes), \(report.staleness), \(report.releaseLimit))
                """, logger: logger
            ).collect().first?.decode(String?.self)
        } catch {
            throw PostgresErrors.map(error, what)
        }
        switch outcome {
        case "recorded": return
        case "duplicate": throw Self.alreadyReported(report)
        case "released":
            throw StoreError(.cycleClosed, "buffer \(report.cycle) holds its \(report.releaseLimit ?? 0) reports: it is being released")
        case "missing": try Self.requireOpen(nil, processID: report.processID, cycle: report.cycle)
        case let status?: try Self.requireOpen(status, processID: report.processID, cycle: report.cycle)
        case nil: break
        }
        throw StoreError(.corrupt, "\(what): orchard_record_report answered \(outcome.map { "'\($0)'" } ?? "nothing")")
    }

    /// The refusal of a report whose assignment is unknown or already reported.
    private static func alreadyReported(_ report: ReportRecord) -> StoreError {
        StoreError(
            .duplicate, "no unreported assignment for worker '\(report.workerID)' and request key '\(report.requestKey)' in cycle \(report.cycle)")
    }

    public func recordFoldedReports(
        _ reports: [ReportRecord], base: Int, forgetting: [String], fold: @Sendable ([Int]) throws -> StoredPartialSum
    ) async throws -> (outcomes: [Result<Void, StoreError>], reported: Int?) {
        guard let first = reports.first else { return ([], nil) }
        let (processID, cycle, instance, limit) = (first.processID, first.cycle, first.instance, first.releaseLimit)
        guard reports.allSatisfy({ $0.processID == processID && $0.cycle == cycle && $0.instance == instance && $0.releaseLimit == limit }) else {
            throw StoreError(.corrupt, "a batch of folded reports must share one process, cycle, instance and release limit")
        }
        let what = "record \(reports.count) reports folded into the partial sum of instance '\(instance)' in cycle \(cycle) of process '\(processID)'"
        var outcomes = [Result<Void, StoreError>?](repeating: nil, count: reports.count)
        // One statement (its own transaction) a try; a try that finds reports to refuse writes nothing, and the next
        // goes without them.
        var candidates = Array(reports.indices)
        while !candidates.isEmpty || !forgetting.isEmpty {
            let sum = try fold(candidates)
            let batch = candidates.map { reports[$0] }
            let answer: (String, Int?, [String]?)?
            do {
                answer = try await client.query(
                    """
                    SELECT outcome, held, refused FROM orchard_record_folded(
                        \(processID), \(cycle), \(instance), \(batch.map(\.workerID)), \(batch.map(\.requestKey)), \(batch.map(\.sampleCount)),
                        \(batch.map(\.metricsJSON)), \(batch.map(\.unclipped)), \(batch.map { $0.staleness ?? -1 }), \(limit), \(base), \(forgetting),
                        \(Self.buffer(sum.bytes)), \(sum.weight), \(sum.reports), \(sum.unclipped))
                    """, logger: logger
                ).collect().first?.decode((String, Int?, [String]?).self)
            } catch {
                throw PostgresErrors.map(error, what)
            }
            switch answer?.0 {
            case "recorded":
                for index in candidates { outcomes[index] = .success(()) }
                return (outcomes.map { $0 ?? .success(()) }, answer?.1)
            case "duplicate":
                let refused = Set(answer?.2 ?? [])
                let kept = candidates.filter { !refused.contains(reports[$0].workerID) }
                guard kept.count < candidates.count else { throw StoreError(.corrupt, "\(what): refused workers that were not in the batch") }
                for index in candidates where refused.contains(reports[index].workerID) { outcomes[index] = .failure(Self.alreadyReported(reports[index])) }
                candidates = kept
            case "room":
                let room = answer?.1 ?? 0
                guard room < candidates.count else { throw StoreError(.corrupt, "\(what): a buffer with room for \(room) refused \(candidates.count)") }
                for index in candidates.dropFirst(room) {
                    outcomes[index] = .failure(StoreError(.cycleClosed, "buffer \(cycle) holds its \(limit ?? 0) reports: it is being released"))
                }
                candidates = Array(candidates.prefix(room))
            case "base":
                throw StoreError(
                    .corrupt,
                    "the partial sum of instance '\(instance)' in cycle \(cycle) of process '\(processID)' holds \(answer?.1 ?? 0) reports, not the \(base) its running sum was built on"
                )
            case "missing": try Self.requireOpen(nil, processID: processID, cycle: cycle)
            case let status? where status != "open": try Self.requireOpen(status, processID: processID, cycle: cycle)
            default: throw StoreError(.corrupt, "\(what): orchard_record_folded answered \(answer.map { "'\($0.0)'" } ?? "nothing")")
            }
        }
        return (outcomes.map { $0 ?? .success(()) }, nil)
    }

    public func discardReports(processID: String, cycle: Int, workers: [String]) async throws {
        guard !workers.isEmpty else { return }
        try await transaction("discard unreadable reports of cycle \(cycle) of process '\(processID)'") { connection in
            let status = try await lockCycle(connection, processID: processID, cycle: cycle, exclusive: false)
            try Self.requireOpen(status, processID: processID, cycle: cycle)
            try await run(
                connection,
                """
                UPDATE assignments SET reported = FALSE, diff = NULL, sample_count = NULL
                WHERE process_id = \(processID) AND cycle = \(cycle) AND worker_id = ANY(\(workers)) AND reported
                """)
        }
    }

    public func foldReports(processID: String, cycle: Int, instance: String, sum: StoredPartialSum, workers: [String]) async throws {
        try await transaction("fold reports of instance '\(instance)' into cycle \(cycle) of process '\(processID)'") { connection in
            let status = try await lockCycle(connection, processID: processID, cycle: cycle, exclusive: false)
            try Self.requireOpen(status, processID: processID, cycle: cycle)
            try await run(
                connection,
                """
                INSERT INTO partial_sums (process_id, cycle, instance, sum, weight, reports, unclipped)
                VALUES (\(processID), \(cycle), \(instance), \(Self.buffer(sum.bytes)), \(sum.weight), \(sum.reports), \(sum.unclipped))
                ON CONFLICT (process_id, cycle, instance) DO UPDATE
                SET sum = EXCLUDED.sum, weight = EXCLUDED.weight, reports = EXCLUDED.reports, unclipped = EXCLUDED.unclipped
                """)
            if !workers.isEmpty {
                try await run(
                    connection, "UPDATE assignments SET diff = NULL WHERE process_id = \(processID) AND cycle = \(cycle) AND worker_id = ANY(\(workers))")
            }
        }
    }

    public func sealCycle(processID: String, cycle: Int, at date: Date) async throws -> Bool {
        try await transaction("seal cycle \(cycle) of process '\(processID)'") { connection -> Bool in
            let sealed = try await run(
                connection,
                """
                UPDATE cycles SET status = 'closing', sealed_at = \(date.timeIntervalSince1970)
                WHERE process_id = \(processID) AND number = \(cycle) AND status = 'open' RETURNING 1
                """)
            if !sealed.isEmpty { return true }
            let status = try await run(connection, "SELECT status FROM cycles WHERE process_id = \(processID) AND number = \(cycle)").first.map {
                try $0.decode(String.self)
            }
            switch status {
            case "closing": return false
            case nil: throw StoreError(.cycleClosed, "cycle \(cycle) of process '\(processID)' does not exist")
            case let status?: throw StoreError(.cycleClosed, "cycle \(cycle) of process '\(processID)' is closed (\(status))")
            }
        }
    }

    public func closeCycle(_ closure: CycleClosure) async throws {
        let processID = closure.processID
        let cycle = closure.closedCycle
        try await transaction("close cycle \(cycle) of process '\(processID)'") { connection in
            // The process row first, as a deletion takes it: a close and a concurrent deletion of the process then wait
            // for each other in one order, instead of deadlocking (cycle row here, process row there).
            let latest = try await run(connection, "SELECT latest_checkpoint FROM processes WHERE id = \(processID) FOR NO KEY UPDATE").first
            if let latest, let refusal = closure.staleBase(latest: try latest.decode(Int.self)) { throw refusal }
            let aggregated = closure.checkpoint != nil
            // Exactly once: a concurrent close waits on the row, then finds it closed.
            let closed = try await run(
                connection,
                """
                UPDATE cycles SET status = \(aggregated ? "aggregated" : "abandoned")
                WHERE process_id = \(processID) AND number = \(cycle) AND status IN ('open', 'closing') RETURNING 1
                """)
            guard !closed.isEmpty else { throw StoreError(.cycleClosed, "cycle \(cycle) of process '\(processID)' is not open") }
            // The history record, from the assignment rows about to be deleted.
            let participation = try await run(
                connection,
                """
                SELECT COUNT(*), COUNT(*) FILTER (WHERE reported) FROM assignments WHERE process_id = \(processID) AND cycle = \(cycle)
                """)
            let (assigned, reported) = try participation.first?.decode((Int, Int).self) ?? (0, 0)
            let metrics = try await run(
                connection,
                """
                SELECT metrics FROM assignments WHERE process_id = \(processID) AND cycle = \(cycle) AND reported AND metrics IS NOT NULL
                """
            ).map { try $0.decode(String.self) }
            let means = CycleRecordSummary.json(CycleRecordSummary.means(metrics))
            try await run(
                connection,
                """
                UPDATE cycles SET closed_at = \(closure.closedAt?.timeIntervalSince1970), assigned = \(assigned), reported = \(reported),
                    metrics = \(means), published = \(closure.checkpoint?.number)
                WHERE process_id = \(processID) AND number = \(cycle)
                """)
            let carryOverAfter = closure.nextCycle == nil ? nil : closure.carryOverAfter
            if let carryOverAfter {
                // Buffered: the devices still training keep their assignments, moved into the next buffer below.
                try await run(
                    connection,
                    """
                    DELETE FROM assignments WHERE process_id = \(processID) AND cycle = \(cycle)
                        AND NOT (NOT reported AND assigned_at > \(carryOverAfter.timeIntervalSince1970))
                    """)
            } else {
                try await run(connection, "DELETE FROM assignments WHERE process_id = \(processID) AND cycle = \(cycle)")
            }
            try await run(connection, "DELETE FROM partial_sums WHERE process_id = \(processID) AND cycle = \(cycle)")
            try await run(connection, "DELETE FROM secure_aggregation_events WHERE process_id = \(processID) AND cycle = \(cycle)")
            if let checkpoint = closure.checkpoint {
                try await run(
                    connection,
                    "INSERT INTO checkpoints (process_id, number, weights) VALUES (\(processID), \(checkpoint.number), \(Self.buffer(checkpoint.weights)))")
                try await run(
                    connection, "DELETE FROM checkpoints WHERE process_id = \(processID) AND number <= \(checkpoint.number - max(1, closure.retention))")
                let optimizer = closure.optimizerState.map(Self.buffer)
                let privacy = closure.privacyState.map(Self.buffer)
                try await run(
                    connection,
                    """
                    UPDATE processes SET latest_checkpoint = \(checkpoint.number), cycles_completed = cycles_completed + 1,
                        optimizer_state = \(optimizer), privacy_state = \(privacy)
                    WHERE id = \(processID)
                    """)
            } else {
                try await run(connection, "UPDATE processes SET cycles_abandoned = cycles_abandoned + 1 WHERE id = \(processID)")
            }
            if let next = closure.nextCycle {
                try await run(
                    connection,
                    """
                    INSERT INTO cycles (process_id, number, checkpoint, opened_at, status)
                    VALUES (\(processID), \(next.number), \(next.checkpoint), \(next.openedAt.timeIntervalSince1970), 'open')
                    """)
                if carryOverAfter != nil {
                    try await run(connection, "UPDATE assignments SET cycle = \(next.number) WHERE process_id = \(processID) AND cycle = \(cycle)")
                }
            } else {
                try await run(connection, "UPDATE processes SET completed = TRUE WHERE id = \(processID)")
            }
        }
    }

    public func cycleRecords(processID: String, limit: Int) async throws -> [CycleRecord] {
        let what = "read the cycle history of process '\(processID)'"
        let rows = try await rows(
            what,
            """
            SELECT number, status, published, opened_at, closed_at, assigned, reported, metrics FROM cycles
            WHERE process_id = \(processID) AND status IN ('aggregated', 'abandoned') AND assigned IS NOT NULL
            ORDER BY number DESC LIMIT \(max(0, limit))
            """)
        do {
            return try rows.reversed().map { row in
                let (number, status, published, openedAt, closedAt, assigned, reported, metrics) = try row.decode(
                    (Int, String, Int?, Double?, Double?, Int?, Int?, String?).self
                )
                return CycleRecord(
                    cycle: number, outcome: status == "aggregated" ? .aggregated : .abandoned, assigned: assigned ?? 0, reported: reported ?? 0,
                    checkpoint: published, openedAt: openedAt, closedAt: closedAt, metrics: CycleRecordSummary.decode(metrics)
                )
            }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    // MARK: - Server-side evaluation

    public func setEvaluationData(processID: String, data: (bytes: [UInt8], samples: Int)?) async throws {
        try await transaction("attach evaluation data to process '\(processID)'") { connection in
            guard try await !run(connection, "SELECT 1 FROM processes WHERE id = \(processID) FOR UPDATE").isEmpty else {
                throw StoreError(.notFound, "no process '\(processID)'")
            }
            if let data {
                _ = try await run(
                    connection,
                    """
                    INSERT INTO evaluation_data (process_id, bytes, samples) VALUES (\(processID), \(Self.buffer(data.bytes)), \(data.samples))
                    ON CONFLICT (process_id) DO UPDATE SET bytes = EXCLUDED.bytes, samples = EXCLUDED.samples
                    """)
            } else {
                _ = try await run(connection, "DELETE FROM evaluation_data WHERE process_id = \(processID)")
            }
        }
    }

    public func evaluationData(processID: String) async throws -> (bytes: [UInt8], samples: Int)? {
        let what = "read the evaluation data of process '\(processID)'"
        let rows = try await rows(what, "SELECT bytes, samples FROM evaluation_data WHERE process_id = \(processID)")
        do {
            return try rows.first.map { row in
                let (bytes, samples) = try row.decode((ByteBuffer, Int).self)
                return (Self.bytes(bytes), samples)
            }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    public func evaluationDataSize(processID: String) async throws -> (bytes: Int, samples: Int)? {
        let what = "read the size of the evaluation data of process '\(processID)'"
        let rows = try await rows(what, "SELECT octet_length(bytes), samples FROM evaluation_data WHERE process_id = \(processID)")
        do {
            return try rows.first.map { row in try row.decode((Int, Int).self) }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    public func recordEvaluation(_ evaluation: CheckpointEvaluation, processID: String) async throws {
        let metrics = CycleRecordSummary.json(evaluation.metrics)
        _ = try await rows(
            "record the evaluation of checkpoint \(evaluation.checkpoint) of process '\(processID)'",
            """
            INSERT INTO evaluations (process_id, checkpoint, samples, metrics, evaluated_at)
            SELECT id, \(evaluation.checkpoint), \(evaluation.samples), \(metrics), \(evaluation.evaluatedAt) FROM processes WHERE id = \(processID)
            ON CONFLICT (process_id, checkpoint) DO UPDATE SET samples = EXCLUDED.samples, metrics = EXCLUDED.metrics, evaluated_at = EXCLUDED.evaluated_at
            """)
    }

    public func evaluations(processID: String, limit: Int) async throws -> [CheckpointEvaluation] {
        let what = "read the evaluations of process '\(processID)'"
        let rows = try await rows(
            what,
            "SELECT checkpoint, samples, metrics, evaluated_at FROM evaluations WHERE process_id = \(processID) ORDER BY checkpoint DESC LIMIT \(max(0, limit))"
        )
        do {
            return try rows.reversed().map { row in
                let (checkpoint, samples, metrics, evaluatedAt) = try row.decode((Int, Int, String, Double).self)
                return CheckpointEvaluation(checkpoint: checkpoint, samples: samples, metrics: CycleRecordSummary.decode(metrics), evaluatedAt: evaluatedAt)
            }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    // MARK: - Federated evaluation

    public func recordEvaluationResult(_ result: StoredEvaluationResult, processID: String) async throws -> Int {
        let metrics = CycleRecordSummary.json(result.metrics)
        // The process row is shared-locked: a finalization (which locks it exclusively) cannot slip between the check
        // and the insert, so no acknowledged result is left out of its checkpoint's aggregate.
        return try await transaction("record an evaluation result of checkpoint \(result.checkpoint) of process '\(processID)'") { connection in
            guard try await !run(connection, "SELECT 1 FROM processes WHERE id = \(processID) FOR SHARE").isEmpty else {
                throw StoreError(.notFound, "no process '\(processID)'")
            }
            let finalized = try await run(
                connection, "SELECT 1 FROM federated_evaluations WHERE process_id = \(processID) AND checkpoint = \(result.checkpoint)")
            guard finalized.isEmpty else {
                throw StoreError(.cycleClosed, "the federated evaluation of checkpoint \(result.checkpoint) is finalized")
            }
            let inserted = try await run(
                connection,
                """
                INSERT INTO evaluation_results (process_id, checkpoint, worker_id, samples, metrics, received_at, positions)
                VALUES (\(processID), \(result.checkpoint), \(result.workerID), \(result.samples), \(metrics), \(result.receivedAt), \(result.positions))
                ON CONFLICT DO NOTHING RETURNING 1
                """)
            guard !inserted.isEmpty else {
                throw StoreError(.duplicate, "worker '\(result.workerID)' already sent a result for checkpoint \(result.checkpoint)")
            }
            let count = try await run(
                connection, "SELECT count(*) FROM evaluation_results WHERE process_id = \(processID) AND checkpoint = \(result.checkpoint)")
            return try count.first?.decode(Int.self) ?? 0
        }
    }

    public func evaluationResults(processID: String, checkpoint: Int) async throws -> [StoredEvaluationResult] {
        let what = "read the evaluation results of checkpoint \(checkpoint) of process '\(processID)'"
        let rows = try await rows(
            what,
            """
            SELECT worker_id, samples, metrics, received_at, positions FROM evaluation_results WHERE process_id = \(processID) AND checkpoint = \(checkpoint)
            ORDER BY worker_id
            """)
        do {
            return try Self.evaluationResults(rows, checkpoint: checkpoint)
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    /// Results read as `worker_id, samples, metrics, received_at` rows of one checkpoint.
    private static func evaluationResults(_ rows: [PostgresRow], checkpoint: Int) throws -> [StoredEvaluationResult] {
        try rows.map { row in
            let (worker, samples, metrics, receivedAt, positions) = try row.decode((String, Int, String, Double, Int?).self)
            return StoredEvaluationResult(
                checkpoint: checkpoint, workerID: worker, samples: samples, metrics: CycleRecordSummary.decode(metrics), receivedAt: receivedAt,
                positions: positions)
        }
    }

    public func pendingEvaluationCheckpoints(processID: String) async throws -> [Int] {
        let what = "list the pending evaluations of process '\(processID)'"
        let rows = try await rows(what, "SELECT DISTINCT checkpoint FROM evaluation_results WHERE process_id = \(processID) ORDER BY checkpoint")
        do {
            return try rows.map { try $0.decode(Int.self) }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    public func finalizeFederatedEvaluation(
        processID: String, checkpoint: Int, aggregate: @Sendable ([StoredEvaluationResult], Int) -> CheckpointEvaluation
    ) async throws -> CheckpointEvaluation? {
        // The process row is locked exclusively: no result is recorded (that takes a shared lock) between the read of the
        // results and their deletion, and no other instance finalizes meanwhile.
        try await transaction("finalize the federated evaluation of checkpoint \(checkpoint) of process '\(processID)'") { connection in
            guard try await !run(connection, "SELECT 1 FROM processes WHERE id = \(processID) FOR UPDATE").isEmpty else { return nil }
            let finalized = try await run(connection, "SELECT 1 FROM federated_evaluations WHERE process_id = \(processID) AND checkpoint = \(checkpoint)")
            if !finalized.isEmpty {
                try await run(connection, "DELETE FROM evaluation_results WHERE process_id = \(processID) AND checkpoint = \(checkpoint)")
                return nil
            }
            let rows = try await run(
                connection,
                """
                SELECT worker_id, samples, metrics, received_at, positions FROM evaluation_results WHERE process_id = \(processID) AND checkpoint = \(checkpoint)
                ORDER BY worker_id
                """)
            let results = try Self.evaluationResults(rows, checkpoint: checkpoint)
            guard !results.isEmpty else { return nil }
            let recorded = try await run(connection, "SELECT count(*) FROM federated_evaluations WHERE process_id = \(processID)")
            let evaluation = aggregate(results, try recorded.first?.decode(Int.self) ?? 0)
            let metrics = CycleRecordSummary.json(evaluation.metrics)
            try await run(
                connection,
                """
                INSERT INTO federated_evaluations (process_id, checkpoint, samples, devices, metrics, epsilon, evaluated_at)
                VALUES (\(processID), \(checkpoint), \(evaluation.samples), \(evaluation.devices), \(metrics), \(evaluation.epsilon),
                \(evaluation.evaluatedAt))
                """)
            try await run(connection, "DELETE FROM evaluation_results WHERE process_id = \(processID) AND checkpoint = \(checkpoint)")
            return evaluation
        }
    }

    public func federatedEvaluations(processID: String, limit: Int) async throws -> [CheckpointEvaluation] {
        let what = "read the federated evaluations of process '\(processID)'"
        let rows = try await rows(
            what,
            """
            SELECT checkpoint, samples, devices, metrics, epsilon, evaluated_at FROM federated_evaluations WHERE process_id = \(processID)
            ORDER BY checkpoint DESC LIMIT \(max(0, limit))
            """)
        do {
            return try rows.reversed().map { row in
                let (checkpoint, samples, devices, metrics, epsilon, evaluatedAt) = try row.decode((Int, Int, Int?, String, Double?, Double).self)
                return CheckpointEvaluation(
                    checkpoint: checkpoint, samples: samples, metrics: CycleRecordSummary.decode(metrics), evaluatedAt: evaluatedAt, devices: devices,
                    epsilon: epsilon)
            }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    // MARK: - Secure aggregation

    public func appendSecureAggregationEvent(_ event: StoredSecureAggregationEvent, processID: String, cycle: Int, reportedWorker: String?) async throws {
        try await transaction("append secure-aggregation event \(event.sequence) to cycle \(cycle) of process '\(processID)'") { connection in
            let status = try await lockCycle(connection, processID: processID, cycle: cycle, exclusive: false)
            try Self.requireOpen(status, processID: processID, cycle: cycle)
            do {
                try await run(
                    connection,
                    """
                    INSERT INTO secure_aggregation_events (process_id, cycle, sequence, body, words)
                    VALUES (\(processID), \(cycle), \(event.sequence), \(Self.buffer(event.body)), \(event.words.map(Self.buffer)))
                    """)
            } catch let error where PostgresErrors.isUniqueViolation(error) {
                throw StoreError(.duplicate, "secure-aggregation event \(event.sequence) of cycle \(cycle) exists")
            }
            if let reportedWorker {
                let updated = try await run(
                    connection,
                    """
                    UPDATE assignments SET reported = TRUE WHERE process_id = \(processID) AND cycle = \(cycle) AND worker_id = \(reportedWorker) RETURNING 1
                    """)
                guard !updated.isEmpty else { throw StoreError(.notFound, "worker \(reportedWorker) holds no assignment in cycle \(cycle)") }
            }
        }
    }

    public func secureAggregationEvents(processID: String, cycle: Int, from first: Int) async throws -> [StoredSecureAggregationEvent] {
        let what = "read the secure-aggregation events of cycle \(cycle) of process '\(processID)'"
        let rows = try await rows(
            what,
            """
            SELECT sequence, body, words FROM secure_aggregation_events
            WHERE process_id = \(processID) AND cycle = \(cycle) AND sequence >= \(first) ORDER BY sequence
            """)
        do {
            return try rows.map { row in
                let (sequence, body, words) = try row.decode((Int, ByteBuffer, ByteBuffer?).self)
                return StoredSecureAggregationEvent(sequence: sequence, body: Self.bytes(body), words: words.map(Self.bytes))
            }
        } catch {
            throw PostgresErrors.map(error, what)
        }
    }

    /// Runs `body` holding a session-level advisory lock on the process (key space ``secureAggregationLockClass``,
    /// the process id hashed by `hashtext`) on a connection of the lock pool. Every instance sharing the database
    /// takes the same lock, so their steps of the process's secure aggregation are serialised; if the holder dies,
    /// its connection closes and PostgreSQL releases the lock.
    public func withSecureAggregationLock<T: Sendable>(processID: String, _ body: @Sendable () async throws -> T) async throws -> T {
        // Waiting: a lock never comes back nil.
        try await withSecureAggregationLock(processID: processID, waiting: true, body)!
    }

    /// ``withSecureAggregationLock(processID:_:)`` with `pg_try_advisory_lock`: nil at once when another session holds it.
    public func withSecureAggregationLockIfFree<T: Sendable>(processID: String, _ body: @Sendable () async throws -> T) async throws -> T? {
        try await withSecureAggregationLock(processID: processID, waiting: false, body)
    }

    private func withSecureAggregationLock<T: Sendable>(processID: String, waiting: Bool, _ body: @Sendable () async throws -> T) async throws -> T? {
        let logger = self.logger
        let outcome: Result<T, any Error>?
        do {
            outcome = try await locks.withConnection { connection async throws -> Result<T, any Error>? in
                if waiting {
                    _ = try await connection.query("SELECT pg_advisory_lock(\(Self.secureAggregationLockClass), hashtext(\(processID)))", logger: logger)
                        .collect()
                } else {
                    let taken = try await connection.query(
                        "SELECT pg_try_advisory_lock(\(Self.secureAggregationLockClass), hashtext(\(processID)))", logger: logger
                    ).collect()
                    guard try taken.first?.decode(Bool.self) == true else { return nil }
                }
                let result: Result<T, any Error>
                do {
                    result = .success(try await body())
                } catch {
                    result = .failure(error)
                }
                do {
                    _ = try await connection.query("SELECT pg_advisory_unlock(\(Self.secureAggregationLockClass), hashtext(\(processID)))", logger: logger)
                        .collect()
                } catch {
                    // A lock that cannot be released is released with its session.
                    try? await connection.close()
                }
                return result
            }
        } catch {
            throw PostgresErrors.map(error, "lock the secure aggregation of process '\(processID)'")
        }
        return try outcome?.get()
    }

    /// The first key of the two-key advisory locks on processes' secure aggregation ("ORSA"); the migrations' lock is
    /// a one-key lock, a space of its own.
    public static let secureAggregationLockClass: Int32 = 0x4F52_5341

    /// How long a secure-aggregation step waits for the process's lock (the lock connections' `lock_timeout`).
    public static let lockTimeoutSeconds = 30

    /// The first key of the two-key advisory locks on instance ids ("ORIN").
    public static let instanceLockClass: Int32 = 0x4F52_494E

    /// Claims `instanceID` for as long as this store is open: a session-level advisory lock on its own connection,
    /// released by ``shutdown()`` or when the process dies (its connection closes). Tries for the configuration's
    /// ``PostgresStoreConfiguration/instanceClaimWait``.
    /// - Throws: ``OrchardCoordinator/StoreError/Code/locked`` when another running instance holds the id.
    public func claimInstance(_ instanceID: String) async throws {
        try await claimInstance(instanceID, waiting: configuration.instanceClaimWait)
    }

    /// ``claimInstance(_:)``, trying for `waiting` (every 100 ms) before refusing.
    public func claimInstance(_ instanceID: String, waiting: Duration) async throws {
        let connection = try await Self.connect(configuration, logger: logger)
        let deadline = ContinuousClock.now + waiting
        do {
            while true {
                let rows = try await connection.query(
                    "SELECT pg_try_advisory_lock(\(Self.instanceLockClass), hashtext(\(instanceID)))", logger: logger
                ).collect()
                if try rows.first?.decode(Bool.self) == true {
                    let earlier = claim.withLock { held in
                        defer { held = connection }; return held
                    }
                    if let earlier { try? await earlier.close() }
                    return
                }
                guard ContinuousClock.now < deadline else {
                    throw StoreError(
                        .locked,
                        "instance id '\(instanceID)' is held by another running instance sharing this database: give each instance its own --instance-id (two instances with one id overwrite each other's partial sums)"
                    )
                }
                try await Task.sleep(for: .milliseconds(100))
            }
        } catch {
            try? await connection.close()
            if let error = error as? StoreError { throw error }
            throw PostgresErrors.map(error, "claim instance id '\(instanceID)'")
        }
    }
}
