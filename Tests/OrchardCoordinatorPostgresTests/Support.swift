import Foundation
import Logging
import OrchardCoordinator
import OrchardCoordinatorPostgres
import OrchardFormats
import OrchardProtocol
import Testing

/// The PostgreSQL server the tests use: `ORCHARD_POSTGRES_URL` names an administrative URL (e.g.
/// `postgres://orchard:orchard@127.0.0.1:5432/postgres`); each test creates its own database `orchard_test_<hex>` on
/// it and drops it afterwards. Without the variable the PostgreSQL cases are skipped with the reason shown, unless
/// `ORCHARD_REQUIRE_POSTGRES=1` is set (CI), which makes them fail instead.
enum TestDatabase {
    /// The variable naming the administrative URL.
    static let urlVariable = "ORCHARD_POSTGRES_URL"
    /// The variable that turns a missing server from a skip into a failure.
    static let requireVariable = "ORCHARD_REQUIRE_POSTGRES"
    /// The prefix of every database the tests create.
    static let prefix = "orchard_test_"

    static var url: String? {
        guard let value = ProcessInfo.processInfo.environment[urlVariable], !value.isEmpty else { return nil }
        return value
    }

    static var isRequired: Bool { ProcessInfo.processInfo.environment[requireVariable] == "1" }

    /// Whether the PostgreSQL cases run (and, if the variable is unset, fail).
    static var isEnabled: Bool { url != nil || isRequired }

    /// Why PostgreSQL cases are missing, or that they run.
    static var reason: String {
        url != nil
            ? "runs against \(urlVariable)"
            : "\(urlVariable) is not set, so the PostgreSQL cases are skipped; set it to an admin URL such as "
                + "postgres://orchard:orchard@127.0.0.1:5432/postgres (.ci/run starts a cluster and sets it), or set \(requireVariable)=1 to make this a failure"
    }

    /// A trait for tests that need the server: disabled, with ``reason``, when it is not configured.
    static var requirement: ConditionTrait { .enabled(if: isEnabled, Comment(rawValue: reason)) }

    /// The parsed administrative URL; a clear failure when it is missing or does not parse.
    static func adminConfiguration() throws -> PostgresStoreConfiguration {
        guard let url else {
            throw Unavailable(
                message:
                    "\(urlVariable) is not set; .ci/run starts a PostgreSQL cluster and sets it (e.g. postgres://orchard:orchard@127.0.0.1:5432/postgres), and \(requireVariable)=1 makes its absence a failure"
            )
        }
        do {
            return try PostgresStoreConfiguration(url: url)
        } catch {
            throw Unavailable(message: "\(urlVariable) does not parse: \(error)")
        }
    }

    /// Runs `body` with the configuration of a fresh database, dropped afterwards (also when `body` throws).
    static func withDatabase<T: Sendable>(_ body: (PostgresStoreConfiguration) async throws -> T) async throws -> T {
        let admin = try adminConfiguration()
        let name = prefix + (0..<8).map { _ in String(UInt8.random(in: 0...255), radix: 16) }.map { $0.count == 1 ? "0" + $0 : $0 }.joined()
        do {
            try await PostgresAdministration.createDatabase(name, using: admin, logger: logger)
        } catch {
            throw Unavailable(message: "the PostgreSQL server of \(urlVariable) (\(admin)) cannot be used: \(error)")
        }
        var configuration = admin.database(name)
        configuration.poolSize = 4
        let result: Result<T, any Error>
        do {
            result = .success(try await body(configuration))
        } catch {
            result = .failure(error)
        }
        do {
            try await PostgresAdministration.dropDatabase(name, using: admin, logger: logger)
        } catch {
            Issue.record("cannot drop test database \(name): \(error)")
        }
        return try result.get()
    }

    /// Logs nothing below errors (postgres-nio is chatty at debug).
    static let logger: Logger = {
        var logger = Logger(label: "orchard.postgres.tests")
        logger.logLevel = .error
        return logger
    }()

    /// The server is required but missing or unreachable.
    struct Unavailable: Error, CustomStringConvertible {
        var message: String
        var description: String { message }
    }
}

/// The stores the contract suite runs against.
enum StoreKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite, postgres

    var testDescription: String { rawValue }

    /// SQLite always; PostgreSQL when configured (or required, when its absence fails).
    static var underTest: [StoreKind] { TestDatabase.isEnabled ? [.sqlite, .postgres] : [.sqlite] }
}

/// Two handles on one store: for PostgreSQL two instances (two pools, as two coordinators would have), for SQLite the
/// same object twice.
struct Stores: Sendable {
    let main: any CoordinatorStore
    let peer: any CoordinatorStore
    let kind: StoreKind
}

/// Opens a fresh store of `kind`, runs `body`, then closes and deletes it.
func withStores<T: Sendable>(_ kind: StoreKind, _ body: (Stores) async throws -> T) async throws -> T {
    switch kind {
    case .sqlite:
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-contract-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteStore(path: directory.appendingPathComponent("store.sqlite").path)
        return try await body(Stores(main: store, peer: store, kind: kind))
    case .postgres:
        return try await TestDatabase.withDatabase { configuration in
            let main = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            let peer: PostgresStore
            do {
                peer = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            } catch {
                await main.shutdown()
                throw error
            }
            let result: Result<T, any Error>
            do {
                result = .success(try await body(Stores(main: main, peer: peer, kind: kind)))
            } catch {
                result = .failure(error)
            }
            await main.shutdown()
            await peer.shutdown()
            return try result.get()
        }
    }
}

/// A process record and its first cycle.
enum ContractFixture {
    static let model = ModelSpec(
        name: "tiny", inputs: [InputSpec(name: "x", shape: [3])],
        layers: [
            LayerSpec(name: "out", type: .dense, inputs: ["x"], units: 2, inputSize: 3, useBias: true)
        ])

    /// A date with a fractional part, to check dates read back exactly.
    static let epoch = Date(timeIntervalSince1970: 1_700_000_000.125)

    static func process(id: String = "p", name: String = "tiny", version: SemanticVersion = SemanticVersion(1, 0), retention: Int = 2) -> StoredProcess {
        StoredProcess(
            id: id, name: name, version: version, model: model,
            clientConfig: ClientConfig(batchSize: 4, learningRate: 0.05, localEpochs: 1),
            serverConfig: ServerConfig(cycleLength: 600, goalCount: 3, overSelection: 1.3, minimumReports: 1, checkpointRetention: retention),
            createdAt: epoch
        )
    }

    static let initialWeights: [UInt8] = Array(0..<64)

    /// Hosts process `id` with cycle 1 open from checkpoint 0.
    static func host(_ store: any CoordinatorStore, id: String = "p", name: String = "tiny", version: SemanticVersion = SemanticVersion(1, 0)) async throws {
        try await store.createProcess(
            process(id: id, name: name, version: version), initialWeights: initialWeights,
            firstCycle: StoredCycle(number: 1, checkpoint: 0, openedAt: epoch)
        )
    }

    /// Registers `w<i>` for `i` in `range` and records their assignments `k<i>` in cycle `cycle`.
    static func assign(_ store: any CoordinatorStore, _ range: Range<Int>, process: String = "p", cycle: Int = 1) async throws {
        for i in range {
            try await store.registerWorker(id: "w\(i)", processID: process, issuer: nil, subject: nil, at: epoch)
            try await store.recordAssignment(processID: process, cycle: cycle, workerID: "w\(i)", requestKey: "k\(i)", at: epoch)
        }
    }

    static func report(_ i: Int, cycle: Int = 1, instance: String = CoordinatorConfiguration.defaultInstanceID, unclipped: Bool = false) -> ReportRecord {
        ReportRecord(
            processID: "p", cycle: cycle, workerID: "w\(i)", requestKey: "k\(i)", sampleCount: i + 1, metricsJSON: "{\"loss\":\(i)}", unclipped: unclipped,
            instance: instance)
    }

    static func diff(_ i: Int, count: Int = 16) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 * (i + 3) + i) } }

    static func next(_ number: Int, checkpoint: Int) -> StoredCycle {
        StoredCycle(number: number, checkpoint: checkpoint, openedAt: epoch.addingTimeInterval(Double(number)))
    }
}

/// Collects pending diffs from a store's `@Sendable` callback.
final class PendingCollector: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [PendingDiff] = []

    func add(_ diff: PendingDiff) {
        lock.lock()
        defer { lock.unlock() }
        items.append(diff)
    }

    var diffs: [PendingDiff] {
        lock.lock()
        defer { lock.unlock() }
        return items.sorted { $0.workerID < $1.workerID }
    }

    static func pending(_ store: any CoordinatorStore, processID: String = "p", cycle: Int = 1) async throws -> [PendingDiff] {
        let collector = PendingCollector()
        try await store.forEachPendingDiff(processID: processID, cycle: cycle) { collector.add($0) }
        return collector.diffs
    }
}

/// The code of a ``StoreError`` thrown by `body`, or nil when it succeeded (any other error is rethrown).
func storeErrorCode(_ body: () async throws -> Void) async throws -> StoreError.Code? {
    do {
        try await body()
        return nil
    } catch let error as StoreError {
        return error.code
    }
}
