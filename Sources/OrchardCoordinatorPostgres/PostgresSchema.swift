import Logging
import PostgresNIO

/// The store's tables, as numbered migrations. Each runs in its own transaction under a transaction-scoped advisory
/// lock, so coordinator instances starting at once apply each migration exactly once; a version listed in
/// `orchard_schema_migrations` is never run again.
///
/// The layout mirrors ``OrchardCoordinator/SQLiteStore``'s newest version: dates are epoch seconds in DOUBLE PRECISION
/// (so a `Date` reads back exactly as SQLite's REAL does), blobs BYTEA, counts BIGINT.
enum PostgresSchema {
    /// One migration: its version and its statements (one statement per query: the extended protocol runs one).
    struct Migration: Sendable {
        var version: String
        var statements: [String]
    }

    /// The key of the advisory lock that serialises migrations ("ORCHARD\0" as a big-endian 64-bit integer).
    static let lockKey = 0x4F52_4348_4152_4400

    /// The table that lists applied migrations.
    static let migrationsTable = "orchard_schema_migrations"

    /// Every migration, oldest first.
    static let migrations: [Migration] = [
        Migration(
            version: "1-initial",
            statements: [
                """
                CREATE TABLE processes (
                    id TEXT PRIMARY KEY, name TEXT NOT NULL, version TEXT NOT NULL, model TEXT NOT NULL,
                    client_config TEXT NOT NULL, server_config TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
                    completed BOOLEAN NOT NULL DEFAULT FALSE, latest_checkpoint BIGINT NOT NULL DEFAULT 0,
                    cycles_completed BIGINT NOT NULL DEFAULT 0, cycles_abandoned BIGINT NOT NULL DEFAULT 0,
                    optimizer_state BYTEA, privacy_state BYTEA,
                    UNIQUE (name, version))
                """,
                """
                CREATE TABLE checkpoints (
                    process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, number BIGINT NOT NULL,
                    weights BYTEA NOT NULL, PRIMARY KEY (process_id, number))
                """,
                """
                CREATE TABLE cycles (
                    process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, number BIGINT NOT NULL,
                    checkpoint BIGINT NOT NULL, opened_at DOUBLE PRECISION NOT NULL,
                    status TEXT NOT NULL CHECK (status IN ('open', 'closing', 'aggregated', 'abandoned')),
                    sealed_at DOUBLE PRECISION,
                    PRIMARY KEY (process_id, number))
                """,
                // At most one cycle of a process is not closed.
                "CREATE UNIQUE INDEX cycles_current ON cycles (process_id) WHERE status IN ('open', 'closing')",
                """
                CREATE TABLE assignments (
                    process_id TEXT NOT NULL, cycle BIGINT NOT NULL, worker_id TEXT NOT NULL,
                    request_key TEXT NOT NULL UNIQUE, assigned_at DOUBLE PRECISION NOT NULL,
                    reported BOOLEAN NOT NULL DEFAULT FALSE, sample_count BIGINT, metrics TEXT,
                    unclipped BOOLEAN NOT NULL DEFAULT FALSE, instance TEXT, diff BYTEA,
                    PRIMARY KEY (process_id, cycle, worker_id),
                    FOREIGN KEY (process_id, cycle) REFERENCES cycles(process_id, number) ON DELETE CASCADE)
                """,
                // Workers belong to one process and one issuer (NULLs are distinct: anonymous workers never collide).
                """
                CREATE TABLE workers (
                    id TEXT PRIMARY KEY, process_id TEXT, issuer TEXT, subject TEXT, created_at DOUBLE PRECISION NOT NULL,
                    UNIQUE (process_id, issuer, subject))
                """,
                "CREATE TABLE secrets (name TEXT PRIMARY KEY, value BYTEA NOT NULL)",
                // Each instance's running sum of a cycle.
                """
                CREATE TABLE partial_sums (
                    process_id TEXT NOT NULL, cycle BIGINT NOT NULL, instance TEXT NOT NULL, sum BYTEA NOT NULL,
                    weight DOUBLE PRECISION NOT NULL, reports BIGINT NOT NULL, unclipped BIGINT NOT NULL,
                    PRIMARY KEY (process_id, cycle, instance),
                    FOREIGN KEY (process_id, cycle) REFERENCES cycles(process_id, number) ON DELETE CASCADE)
                """,
                """
                CREATE TABLE secure_aggregation_events (
                    process_id TEXT NOT NULL, cycle BIGINT NOT NULL, sequence BIGINT NOT NULL, body BYTEA NOT NULL, words BYTEA,
                    PRIMARY KEY (process_id, cycle, sequence),
                    FOREIGN KEY (process_id, cycle) REFERENCES cycles(process_id, number) ON DELETE CASCADE)
                """,
            ]),
        // An admission in one round trip: the cycle row's lock is held for the function and its commit only, not for
        // four round trips between the coordinator and the database (the lock serialises a cycle's admissions).
        Migration(
            version: "2-admit-function",
            statements: [
                """
                CREATE FUNCTION orchard_admit(p_process TEXT, p_cycle BIGINT, p_worker TEXT, p_key TEXT, p_at DOUBLE PRECISION, p_limit BIGINT)
                RETURNS TABLE (outcome TEXT, existing_key TEXT, existing_reported BOOLEAN, existing_instance TEXT)
                LANGUAGE plpgsql AS $$
                DECLARE
                    cycle_status TEXT;
                    held BIGINT;
                    found_key TEXT;
                    found_reported BOOLEAN;
                    found_instance TEXT;
                BEGIN
                    SELECT c.status INTO cycle_status FROM cycles c WHERE c.process_id = p_process AND c.number = p_cycle FOR UPDATE;
                    IF cycle_status IS DISTINCT FROM 'open' THEN
                        RETURN QUERY SELECT 'closed'::TEXT, NULL::TEXT, NULL::BOOLEAN, NULL::TEXT;
                        RETURN;
                    END IF;
                    SELECT a.request_key, a.reported, a.instance INTO found_key, found_reported, found_instance
                        FROM assignments a WHERE a.process_id = p_process AND a.cycle = p_cycle AND a.worker_id = p_worker;
                    IF found_key IS NOT NULL THEN
                        RETURN QUERY SELECT 'existing'::TEXT, found_key, found_reported, found_instance;
                        RETURN;
                    END IF;
                    SELECT COUNT(*) INTO held FROM assignments a WHERE a.process_id = p_process AND a.cycle = p_cycle;
                    IF held >= p_limit THEN
                        RETURN QUERY SELECT 'full'::TEXT, NULL::TEXT, NULL::BOOLEAN, NULL::TEXT;
                        RETURN;
                    END IF;
                    INSERT INTO assignments (process_id, cycle, worker_id, request_key, assigned_at) VALUES (p_process, p_cycle, p_worker, p_key, p_at);
                    RETURN QUERY SELECT 'admitted'::TEXT, NULL::TEXT, NULL::BOOLEAN, NULL::TEXT;
                END
                $$
                """
            ]),
        // Diffs, sums and weights are float arrays that pglz cannot shrink: stored out of line without the attempt.
        Migration(
            version: "3-uncompressed-blobs",
            statements: [
                "ALTER TABLE assignments ALTER COLUMN diff SET STORAGE EXTERNAL",
                "ALTER TABLE partial_sums ALTER COLUMN sum SET STORAGE EXTERNAL",
                "ALTER TABLE checkpoints ALTER COLUMN weights SET STORAGE EXTERNAL",
                "ALTER TABLE secure_aggregation_events ALTER COLUMN words SET STORAGE EXTERNAL",
            ]),
        // The durable cycle history (the dashboard's): each closed cycle's participation, metrics and closing time.
        Migration(
            version: "4-cycle-history",
            statements: [
                "ALTER TABLE cycles ADD COLUMN closed_at DOUBLE PRECISION",
                "ALTER TABLE cycles ADD COLUMN assigned BIGINT",
                "ALTER TABLE cycles ADD COLUMN reported BIGINT",
                "ALTER TABLE cycles ADD COLUMN metrics TEXT",
                "ALTER TABLE cycles ADD COLUMN published BIGINT",
            ]),
        // Server-side evaluation: a process's held-out data and each checkpoint's evaluation on it.
        Migration(
            version: "5-evaluation",
            statements: [
                """
                CREATE TABLE evaluation_data (
                    process_id TEXT PRIMARY KEY REFERENCES processes(id) ON DELETE CASCADE, bytes BYTEA NOT NULL, samples BIGINT NOT NULL)
                """,
                """
                CREATE TABLE evaluations (
                    process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, checkpoint BIGINT NOT NULL, samples BIGINT NOT NULL,
                    metrics TEXT NOT NULL, evaluated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (process_id, checkpoint))
                """,
            ]),
        // Federated evaluation: devices' results per checkpoint until it is finalized, then the aggregate.
        Migration(
            version: "6-federated-evaluation",
            statements: [
                """
                CREATE TABLE evaluation_results (
                    process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, checkpoint BIGINT NOT NULL, worker_id TEXT NOT NULL,
                    samples BIGINT NOT NULL, metrics TEXT NOT NULL, received_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (process_id, checkpoint, worker_id))
                """,
                """
                CREATE TABLE federated_evaluations (
                    process_id TEXT NOT NULL REFERENCES processes(id) ON DELETE CASCADE, checkpoint BIGINT NOT NULL, samples BIGINT NOT NULL,
                    devices BIGINT, metrics TEXT NOT NULL, epsilon DOUBLE PRECISION, evaluated_at DOUBLE PRECISION NOT NULL,
                    PRIMARY KEY (process_id, checkpoint))
                """,
            ]),
        // Buffered aggregation: a report's staleness, and admission that counts only the devices still training
        // (unreported assignments admitted after `p_in_flight_after`) when that is given; it replaces `orchard_admit`.
        Migration(
            version: "7-buffered",
            statements: [
                "ALTER TABLE assignments ADD COLUMN staleness BIGINT",
                """
                CREATE FUNCTION orchard_admit_in_flight(
                    p_process TEXT, p_cycle BIGINT, p_worker TEXT, p_key TEXT, p_at DOUBLE PRECISION, p_limit BIGINT, p_in_flight_after DOUBLE PRECISION)
                RETURNS TABLE (outcome TEXT, existing_key TEXT, existing_reported BOOLEAN, existing_instance TEXT, existing_at DOUBLE PRECISION)
                LANGUAGE plpgsql AS $$
                DECLARE
                    cycle_status TEXT;
                    held BIGINT;
                    found_key TEXT;
                    found_reported BOOLEAN;
                    found_instance TEXT;
                    found_at DOUBLE PRECISION;
                BEGIN
                    SELECT c.status INTO cycle_status FROM cycles c WHERE c.process_id = p_process AND c.number = p_cycle FOR UPDATE;
                    IF cycle_status IS DISTINCT FROM 'open' THEN
                        RETURN QUERY SELECT 'closed'::TEXT, NULL::TEXT, NULL::BOOLEAN, NULL::TEXT, NULL::DOUBLE PRECISION;
                        RETURN;
                    END IF;
                    SELECT a.request_key, a.reported, a.instance, a.assigned_at INTO found_key, found_reported, found_instance, found_at
                        FROM assignments a WHERE a.process_id = p_process AND a.cycle = p_cycle AND a.worker_id = p_worker;
                    IF found_key IS NOT NULL THEN
                        RETURN QUERY SELECT 'existing'::TEXT, found_key, found_reported, found_instance, found_at;
                        RETURN;
                    END IF;
                    SELECT COUNT(*) INTO held FROM assignments a WHERE a.process_id = p_process AND a.cycle = p_cycle
                        AND (p_in_flight_after IS NULL OR (NOT a.reported AND a.assigned_at > p_in_flight_after));
                    IF held >= p_limit THEN
                        RETURN QUERY SELECT 'full'::TEXT, NULL::TEXT, NULL::BOOLEAN, NULL::TEXT, NULL::DOUBLE PRECISION;
                        RETURN;
                    END IF;
                    INSERT INTO assignments (process_id, cycle, worker_id, request_key, assigned_at) VALUES (p_process, p_cycle, p_worker, p_key, p_at);
                    RETURN QUERY SELECT 'admitted'::TEXT, NULL::TEXT, NULL::BOOLEAN, NULL::TEXT, NULL::DOUBLE PRECISION;
                END
                $$
                """,
                "DROP FUNCTION orchard_admit(TEXT, BIGINT, TEXT, TEXT, DOUBLE PRECISION, BIGINT)",
            ]),
        // A sequence model's evaluation results: the positions their accuracy and perplexity are means over.
        Migration(version: "8-evaluation-positions", statements: ["ALTER TABLE evaluation_results ADD COLUMN positions BIGINT"]),
        // Reports in one statement each, its own transaction: one round trip and plans kept by PL/pgSQL. A report kept
        // whole (a robust rule's) locks the cycle row as before (shared; exclusive under a release limit, whose reports
        // count what is committed one after another) and the answer names the outcome; a batch folded into its
        // instance's partial sum does the same for every report of the batch and writes the sum once.
        Migration(
            version: "9-report-functions",
            statements: [
                // The cycle row locked for a report (exclusive under a release limit, else shared); its status, or NULL.
                """
                CREATE FUNCTION orchard_lock_cycle(p_process TEXT, p_cycle BIGINT, p_exclusive BOOLEAN) RETURNS TEXT LANGUAGE plpgsql AS $$
                DECLARE
                    cycle_status TEXT;
                BEGIN
                    IF p_exclusive THEN
                        SELECT c.status INTO cycle_status FROM cycles c WHERE c.process_id = p_process AND c.number = p_cycle FOR UPDATE;
                    ELSE
                        SELECT c.status INTO cycle_status FROM cycles c WHERE c.process_id = p_process AND c.number = p_cycle FOR SHARE;
                    END IF;
                    RETURN cycle_status;
                END
                $$
                """,
                """
                CREATE FUNCTION orchard_record_report(
                    p_process TEXT, p_cycle BIGINT, p_worker TEXT, p_key TEXT, p_samples BIGINT, p_metrics TEXT, p_unclipped BOOLEAN,
                    p_instance TEXT, p_diff BYTEA, p_staleness BIGINT, p_release_limit BIGINT)
                RETURNS TEXT LANGUAGE plpgsql AS $$
                DECLARE
                    cycle_status TEXT;
                    counted BIGINT;
                BEGIN
                    cycle_status := orchard_lock_cycle(p_process, p_cycle, p_release_limit IS NOT NULL);
                    IF cycle_status IS NULL THEN
                        RETURN 'missing';
                    ELSIF cycle_status <> 'open' THEN
                        RETURN cycle_status;
                    END IF;
                    IF p_release_limit IS NOT NULL THEN
                        SELECT COUNT(*) INTO counted FROM assignments a WHERE a.process_id = p_process AND a.cycle = p_cycle AND a.reported;
                        IF counted >= p_release_limit THEN
                            RETURN 'released';
                        END IF;
                    END IF;
                    UPDATE assignments SET reported = TRUE, sample_count = p_samples, metrics = p_metrics, unclipped = p_unclipped,
                        instance = p_instance, diff = p_diff, staleness = p_staleness
                    WHERE process_id = p_process AND cycle = p_cycle AND worker_id = p_worker AND request_key = p_key AND NOT reported;
                    IF NOT FOUND THEN
                        RETURN 'duplicate';
                    END IF;
                    RETURN 'recorded';
                END
                $$
                """,
                // A batch of reports committed folded into their instance's partial sum, in one statement: nothing is
                // written unless every report is accepted and the stored sum is the one the new sum was built on; the
                // outcome says what stopped it ('missing' or the cycle's status; 'room' with the reports a buffer still
                // takes; 'base' with the reports the stored sum holds; 'duplicate' with the workers refused), and the
                // caller tries again without what was refused. 'recorded' comes with the cycle's count of reports.
                """
                CREATE FUNCTION orchard_record_folded(
                    p_process TEXT, p_cycle BIGINT, p_instance TEXT, p_workers TEXT[], p_keys TEXT[], p_samples BIGINT[], p_metrics TEXT[],
                    p_unclipped BOOLEAN[], p_staleness BIGINT[], p_release_limit BIGINT, p_base BIGINT, p_forgetting TEXT[],
                    p_sum BYTEA, p_weight DOUBLE PRECISION, p_reports BIGINT, p_sum_unclipped BIGINT)
                RETURNS TABLE (outcome TEXT, held BIGINT, refused TEXT[])
                LANGUAGE plpgsql AS $$
                DECLARE
                    cycle_status TEXT;
                    counted BIGINT;
                    stored BIGINT;
                    missing TEXT[];
                BEGIN
                    cycle_status := orchard_lock_cycle(p_process, p_cycle, p_release_limit IS NOT NULL);
                    IF cycle_status IS NULL THEN
                        RETURN QUERY SELECT 'missing'::TEXT, NULL::BIGINT, NULL::TEXT[];
                        RETURN;
                    ELSIF cycle_status <> 'open' THEN
                        RETURN QUERY SELECT cycle_status, NULL::BIGINT, NULL::TEXT[];
                        RETURN;
                    END IF;
                    IF p_release_limit IS NOT NULL THEN
                        SELECT COUNT(*) INTO counted FROM assignments a WHERE a.process_id = p_process AND a.cycle = p_cycle AND a.reported;
                        IF counted + cardinality(p_workers) > p_release_limit THEN
                            RETURN QUERY SELECT 'room'::TEXT, GREATEST(p_release_limit - counted, 0), NULL::TEXT[];
                            RETURN;
                        END IF;
                    END IF;
                    SELECT s.reports INTO stored FROM partial_sums s WHERE s.process_id = p_process AND s.cycle = p_cycle AND s.instance = p_instance FOR UPDATE;
                    IF COALESCE(stored, 0) <> p_base THEN
                        RETURN QUERY SELECT 'base'::TEXT, COALESCE(stored, 0), NULL::TEXT[];
                        RETURN;
                    END IF;
                    -- Row by row through the primary key (a join against the arrays would scan the cycle's rows).
                    FOR i IN 1 .. COALESCE(cardinality(p_workers), 0) LOOP
                        PERFORM 1 FROM assignments a WHERE a.process_id = p_process AND a.cycle = p_cycle AND a.worker_id = p_workers[i]
                            AND a.request_key = p_keys[i] AND NOT a.reported FOR UPDATE;
                        IF NOT FOUND THEN
                            missing := array_append(missing, p_workers[i]);
                        END IF;
                    END LOOP;
                    IF missing IS NOT NULL THEN
                        RETURN QUERY SELECT 'duplicate'::TEXT, NULL::BIGINT, missing;
                        RETURN;
                    END IF;
                    FOR i IN 1 .. COALESCE(cardinality(p_workers), 0) LOOP
                        UPDATE assignments a SET reported = TRUE, sample_count = p_samples[i], metrics = p_metrics[i], unclipped = p_unclipped[i],
                            instance = p_instance, staleness = NULLIF(p_staleness[i], -1)
                        WHERE a.process_id = p_process AND a.cycle = p_cycle AND a.worker_id = p_workers[i] AND a.request_key = p_keys[i] AND NOT a.reported;
                        IF NOT FOUND THEN
                            RAISE EXCEPTION 'worker % of a batch of folded reports was reported twice', p_workers[i];
                        END IF;
                    END LOOP;
                    INSERT INTO partial_sums (process_id, cycle, instance, sum, weight, reports, unclipped)
                    VALUES (p_process, p_cycle, p_instance, p_sum, p_weight, p_reports, p_sum_unclipped)
                    ON CONFLICT (process_id, cycle, instance) DO UPDATE
                    SET sum = EXCLUDED.sum, weight = EXCLUDED.weight, reports = EXCLUDED.reports, unclipped = EXCLUDED.unclipped;
                    IF cardinality(p_forgetting) > 0 THEN
                        UPDATE assignments SET diff = NULL WHERE process_id = p_process AND cycle = p_cycle AND worker_id = ANY(p_forgetting);
                    END IF;
                    RETURN QUERY SELECT 'recorded'::TEXT,
                        (SELECT COUNT(*) FROM assignments a WHERE a.process_id = p_process AND a.cycle = p_cycle AND a.reported), NULL::TEXT[];
                END
                $$
                """,
            ]),
    ]

    /// Applies the migrations not yet applied, each in its own transaction; returns the versions it applied.
    @discardableResult
    static func migrate(_ connection: PostgresConnection, logger: Logger) async throws -> [String] {
        var applied: [String] = []
        for migration in migrations {
            try await connection.rows("BEGIN", logger: logger)
            do {
                try await connection.rows("SELECT pg_advisory_xact_lock(\(lockKey))", logger: logger)
                try await connection.rows(
                    "CREATE TABLE IF NOT EXISTS orchard_schema_migrations (version TEXT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
                    logger: logger
                )
                let done = try await connection.rows("SELECT 1 FROM orchard_schema_migrations WHERE version = \(migration.version)", logger: logger)
                if done.isEmpty {
                    for statement in migration.statements {
                        try await connection.rows(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                    try await connection.rows("INSERT INTO orchard_schema_migrations (version) VALUES (\(migration.version))", logger: logger)
                    applied.append(migration.version)
                }
                try await connection.rows("COMMIT", logger: logger)
            } catch {
                _ = try? await connection.rows("ROLLBACK", logger: logger)
                throw error
            }
        }
        return applied
    }
}

extension PostgresConnection {
    /// Runs a statement and collects its rows (so its errors surface here, before the next statement).
    @discardableResult
    func rows(_ query: PostgresQuery, logger: Logger) async throws -> [PostgresRow] {
        try await self.query(query, logger: logger).collect()
    }
}
