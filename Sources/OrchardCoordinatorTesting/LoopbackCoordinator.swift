public import Foundation
public import Logging
public import OrchardCoordinator
public import OrchardSupport
import Synchronization

/// A coordinator for tests, as a deployment runs it: a real SQLite file in a temporary directory of its own, served over
/// real HTTP (or HTTPS) on a free loopback port, with an injected clock and a seeded generator. Every test target that
/// needs a coordinator on the wire starts one of these (as Hummingbird's tests use `HummingbirdTesting`).
///
/// ```swift
/// try await LoopbackCoordinator.with(clock: ManualClock()) { coordinator in
///     let client = try AdminClient(server: coordinator.url, adminToken: LoopbackCoordinator.adminToken)
///     …
/// }
/// ```
public final class LoopbackCoordinator: Sendable {
    /// The admin token of the default configuration.
    public static let adminToken = "loopback-admin-token"

    /// The temporary directory holding the database (removed by ``stop()``).
    public let directory: URL
    /// The clock the coordinator reads (advance a `ManualClock` to move its deadlines).
    public let clock: any WallClock
    /// The configuration it was opened with, its idle timeout replaced (and reopened with by ``restart(seed:samePort:)``).
    public let configuration: CoordinatorConfiguration
    private let tls: CoordinatorTLS?
    private let timerInterval: Duration?
    private let logger: Logger
    private let running: Mutex<(instance: CoordinatorInstance, server: RunningServer)>

    /// The coordinator's process-wide handle (its store, its HTTP application).
    public var instance: CoordinatorInstance { running.withLock { $0.instance } }
    /// The HTTP server.
    public var server: RunningServer { running.withLock { $0.server } }
    /// The domain object, for calls that bypass HTTP.
    public var coordinator: Coordinator { instance.coordinator }
    /// The port it listens on (kept across ``restart(seed:)``).
    public var port: Int { server.port }
    /// `http://127.0.0.1:<port>`, or `https://…` when served with TLS.
    public var url: String { "\(tls == nil ? "http" : "https")://127.0.0.1:\(port)" }
    /// The SQLite file.
    public var databasePath: String { directory.appendingPathComponent("coordinator.sqlite").path }

    private init(
        directory: URL, clock: any WallClock, configuration: CoordinatorConfiguration, tls: CoordinatorTLS?, timerInterval: Duration?,
        logger: Logger, instance: CoordinatorInstance, server: RunningServer
    ) {
        self.directory = directory
        self.clock = clock
        self.configuration = configuration
        self.tls = tls
        self.timerInterval = timerInterval
        self.logger = logger
        running = Mutex((instance, server))
    }

    /// Opens a coordinator on a fresh SQLite file and serves it on a free loopback port.
    /// - Parameters:
    ///   - configuration: Its settings (admin token ``adminToken`` by default).
    ///   - clock: The clock it reads (`SystemClock` unless the test drives time).
    ///   - seed: Seeds its generator (worker ids, request keys, cohort choices).
    ///   - tls: Serve HTTPS with this certificate and key.
    ///   - timerInterval: How often it closes expired cycles on its own (nil: never; the test advances its clock and
    ///     calls the coordinator).
    ///   - idleTimeout: Replaces the configuration's ``CoordinatorConfiguration/connectionIdleTimeout``. None by default:
    ///     CPU-bound tests running alongside can keep the server's tasks from running for longer than any timeout, and a
    ///     connection closed while the test still sends on it fails the test, not the code under test. A test of the
    ///     timeout sets one.
    ///   - logger: Its logger (silent by default).
    public static func start(
        configuration: CoordinatorConfiguration = CoordinatorConfiguration(adminToken: adminToken), clock: any WallClock = SystemClock(),
        seed: UInt64 = 1, tls: CoordinatorTLS? = nil, timerInterval: Duration? = nil, idleTimeout: Duration? = nil, logger: Logger = silentLogger
    ) async throws -> LoopbackCoordinator {
        var configuration = configuration
        configuration.connectionIdleTimeout = idleTimeout
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-loopback-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        LeftoverDirectories.register(directory)
        do {
            let instance = try await CoordinatorInstance.open(
                database: directory.appendingPathComponent("coordinator.sqlite").path, configuration: configuration, clock: clock,
                random: SplitMix64(seed: seed), logger: logger
            )
            let server = try await instance.serve(port: 0, tls: tls, timerInterval: timerInterval)
            return LoopbackCoordinator(
                directory: directory, clock: clock, configuration: configuration, tls: tls, timerInterval: timerInterval, logger: logger,
                instance: instance, server: server
            )
        } catch {
            try? FileManager.default.removeItem(at: directory)
            LeftoverDirectories.unregister(directory)
            throw error
        }
    }

    /// Runs `body` against a fresh coordinator and stops it afterwards (awaited), whether `body` returns or throws.
    public static func with(
        configuration: CoordinatorConfiguration = CoordinatorConfiguration(adminToken: adminToken), clock: any WallClock = SystemClock(),
        seed: UInt64 = 1, tls: CoordinatorTLS? = nil, timerInterval: Duration? = nil, idleTimeout: Duration? = nil, logger: Logger = silentLogger,
        _ body: (LoopbackCoordinator) async throws -> Void
    ) async throws {
        let coordinator = try await start(
            configuration: configuration, clock: clock, seed: seed, tls: tls, timerInterval: timerInterval, idleTimeout: idleTimeout, logger: logger)
        do {
            try await body(coordinator)
        } catch {
            await coordinator.stop()
            throw error
        }
        await coordinator.stop()
    }

    /// An orderly restart: stops the server, closes the coordinator, reopens the same SQLite file with a generator
    /// seeded by `seed`, and serves it on the same port (`samePort`, for clients that keep the URL; another test may
    /// take the port meanwhile, which fails the restart) or on a free one.
    public func restart(seed: UInt64 = 99, samePort: Bool = true) async throws {
        let (oldInstance, oldServer) = running.withLock { ($0.instance, $0.server) }
        let port = samePort ? oldServer.port : 0
        await oldServer.stop()
        oldInstance.close()
        let instance = try await CoordinatorInstance.open(
            database: databasePath, configuration: configuration, clock: clock, random: SplitMix64(seed: seed), logger: logger
        )
        let server = try await instance.serve(port: port, tls: tls, timerInterval: timerInterval)
        running.withLock { $0 = (instance, server) }
    }

    /// Stops the server, shuts the coordinator down and removes its directory.
    public func stop() async {
        let (instance, server) = running.withLock { ($0.instance, $0.server) }
        await server.stop()
        await instance.shutdown()
        try? FileManager.default.removeItem(at: directory)
        LeftoverDirectories.unregister(directory)
    }

    /// A logger that discards everything.
    public static let silentLogger = Logger(label: "orchard.loopback") { _ in SwiftLogNoOpLogHandler() }
}

/// Directories not yet removed when the test process exits (a coordinator a test never stopped, or one whose test was
/// cut short by its time limit) are removed at exit.
enum LeftoverDirectories {
    private static let paths: Mutex<Set<String>> = {
        atexit {
            for path in LeftoverDirectories.paths.withLock({ $0 }) { try? FileManager.default.removeItem(atPath: path) }
        }
        return Mutex([])
    }()

    static func register(_ directory: URL) {
        _ = paths.withLock { $0.insert(directory.path) }
    }

    static func unregister(_ directory: URL) {
        _ = paths.withLock { $0.remove(directory.path) }
    }
}
