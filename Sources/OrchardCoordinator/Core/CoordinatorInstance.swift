public import OrchardSupport
public import Foundation
public import Hummingbird
public import Logging
import Metrics
public import Prometheus
import ServiceLifecycle
import UnixSignals

/// A coordinator with its store (SQLite, or any other such as PostgreSQL), Prometheus registry and HTTP application, as
/// `orchard serve`, the benchmark and the simulator run it.
public struct CoordinatorInstance: Sendable {
    /// The core.
    public let coordinator: Coordinator
    /// The metrics registry served at `/metrics`.
    public let registry: PrometheusCollectorRegistry
    /// The dashboard's login tokens, sessions and per-cycle history (served at `/dashboard`).
    public let dashboard: Dashboard
    /// The exclusive lock on a SQLite database, held until ``close()`` or until the instance is gone.
    let lock: DatabaseLock?
    /// Releases the store's resources (a connection pool) on ``shutdown()``.
    let release: @Sendable () async -> Void

    /// Locks and opens the SQLite database at `path` (created if absent), resumes every open cycle, and returns the
    /// instance; throws ``StoreError`` with code `locked` while another coordinator holds the database.
    /// - Parameters:
    ///   - path: The SQLite file.
    ///   - durability: SQLite's synchronous mode.
    ///   - configuration: Instance settings.
    ///   - clock: Wall-clock time.
    ///   - random: Randomness for ids and keys.
    ///   - logger: Structured logs.
    public static func open(
        database path: String, durability: SQLiteStore.Durability = .normal,
        configuration: CoordinatorConfiguration = CoordinatorConfiguration(), clock: any WallClock = SystemClock(),
        random: any RandomNumberGenerator & Sendable = SystemRandomNumberGenerator(),
        logger: Logger = Logger(label: "orchard.coordinator")
    ) async throws -> CoordinatorInstance {
        let lock = try DatabaseLock(database: path)
        let dashboard = Dashboard(clock: clock)
        let store = try SQLiteStore(path: path, durability: durability)
        let registry = PrometheusCollectorRegistry()
        let metrics = CoordinatorMetrics(factory: PrometheusMetricsFactory(registry: registry))
        let coordinator = Coordinator(store: store, configuration: configuration, clock: clock, random: random, metrics: metrics, logger: logger)
        try await coordinator.start()
        return CoordinatorInstance(coordinator: coordinator, registry: registry, dashboard: dashboard, lock: lock, release: {})
    }

    /// Starts a coordinator over `store` (e.g. PostgreSQL shared by several instances), resuming every open cycle.
    /// - Parameters:
    ///   - store: The store; `release` is called by ``shutdown()`` to free it.
    ///   - configuration: Instance settings (over a shared store, a distinct ``CoordinatorConfiguration/instanceID`` per instance).
    ///   - clock: Wall-clock time.
    ///   - random: Randomness for ids and keys.
    ///   - logger: Structured logs.
    ///   - release: Frees the store's resources.
    public static func open(
        store: any CoordinatorStore, configuration: CoordinatorConfiguration = CoordinatorConfiguration(), clock: any WallClock = SystemClock(),
        random: any RandomNumberGenerator & Sendable = SystemRandomNumberGenerator(), logger: Logger = Logger(label: "orchard.coordinator"),
        release: @escaping @Sendable () async -> Void = {}
    ) async throws -> CoordinatorInstance {
        let dashboard = Dashboard(clock: clock)
        let registry = PrometheusCollectorRegistry()
        let metrics = CoordinatorMetrics(factory: PrometheusMetricsFactory(registry: registry))
        let coordinator = Coordinator(store: store, configuration: configuration, clock: clock, random: random, metrics: metrics, logger: logger)
        do {
            // Over a shared store no two running instances may have one id: each folds into its id's partial sum.
            if store.isShared { try await store.claimInstance(configuration.instanceID) }
            try await coordinator.start()
        } catch {
            await release()
            throw error
        }
        return CoordinatorInstance(coordinator: coordinator, registry: registry, dashboard: dashboard, lock: nil, release: release)
    }

    /// Releases the database lock and the store's resources; do not use the instance afterwards.
    public func shutdown() async {
        lock?.release()
        await release()
    }

    /// Releases the database lock so another coordinator may open the database: call it after stopping the
    /// server, and do not use the instance afterwards (an orderly restart in one process).
    public func close() {
        lock?.release()
    }

    /// The HTTP application, with the cycle timer when `timerInterval` is set (tests and simulations with an
    /// injected clock pass nil and call ``Coordinator/tick()`` themselves).
    /// - Parameters:
    ///   - host: The address to bind.
    ///   - port: The port; 0 picks a free one, reported to `onServerRunning`.
    ///   - tls: The HTTPS identity, or nil for plain HTTP.
    ///   - timerInterval: Time between cycle-timer ticks, or nil for no timer.
    ///   - logger: The server's logger.
    ///   - onServerRunning: Called with the bound port once the server listens.
    public func application(
        host: String = "127.0.0.1", port: Int = 8080, tls: CoordinatorTLS? = nil, timerInterval: Duration? = .milliseconds(250),
        logger: Logger = Logger(label: "orchard.http"), onServerRunning: @escaping @Sendable (Int) async -> Void = { _ in }
    ) throws -> some ApplicationProtocol {
        let services: [any Service] = timerInterval.map { [CycleTimerService(coordinator: coordinator, interval: $0)] } ?? []
        return try CoordinatorServer.application(
            coordinator: coordinator, registry: registry, host: host, port: port, tls: tls, services: services, logger: logger,
            dashboard: dashboard, onServerRunning: onServerRunning
        )
    }

    /// Runs the HTTP server and the cycle timer until SIGTERM or SIGINT, then shuts down gracefully (in-flight
    /// requests finish; every acknowledged report is already committed).
    public func run(
        host: String, port: Int, tls: CoordinatorTLS? = nil, timerInterval: Duration = .milliseconds(250), logger: Logger = Logger(label: "orchard.http"),
        onServerRunning: @escaping @Sendable (Int) async -> Void = { _ in }
    ) async throws {
        let app = try application(host: host, port: port, tls: tls, timerInterval: timerInterval, logger: logger, onServerRunning: onServerRunning)
        let group = ServiceGroup(services: [app], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
    }

    /// Starts the HTTP server in the background (for tests, benchmarks and simulations) and returns once it
    /// listens.
    /// - Parameters:
    ///   - host: The address to bind.
    ///   - port: The port; 0 (the default) picks a free one.
    ///   - tls: The HTTPS identity, or nil for plain HTTP.
    ///   - timerInterval: Time between cycle-timer ticks, or nil to drive ``Coordinator/tick()`` yourself.
    public func serve(host: String = "127.0.0.1", port: Int = 0, tls: CoordinatorTLS? = nil, timerInterval: Duration? = nil) async throws -> RunningServer {
        let (ports, continuation) = AsyncStream.makeStream(of: Int.self)
        let app = try application(host: host, port: port, tls: tls, timerInterval: timerInterval) { bound in
            continuation.yield(bound)
            continuation.finish()
        }
        // A service group without signal handling: ``RunningServer/stop()`` shuts it down gracefully (in-flight
        // requests finish), as SIGTERM does for `orchard serve`.
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: [app], logger: Logger(label: "orchard.http")))
        let task = Task {
            defer { continuation.finish() }
            try await group.run()
        }
        var iterator = ports.makeAsyncIterator()
        guard let bound = await iterator.next() else {
            if case .failure(let error) = await task.result { throw error }
            throw CoordinatorError.internalError("the HTTP server stopped before listening")
        }
        return RunningServer(host: host, port: bound, scheme: tls == nil ? "http" : "https", group: group, task: task)
    }
}

/// An HTTP server started by ``CoordinatorInstance/serve(host:port:tls:timerInterval:)``.
public struct RunningServer: Sendable {
    /// The bound address.
    public let host: String
    /// The bound port.
    public let port: Int
    /// `https` when the server speaks TLS, else `http`.
    public let scheme: String
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    init(host: String, port: Int, scheme: String, group: ServiceGroup, task: Task<Void, any Error>) {
        self.host = host
        self.port = port
        self.scheme = scheme
        self.group = group
        self.task = task
    }

    /// The server's base URL, e.g. `http://127.0.0.1:53124` (or `https://…` with TLS).
    public var baseURL: URL { URL(string: "\(scheme)://\(host):\(port)")! }

    /// Stops the server gracefully (requests in flight are answered) and waits for it to finish.
    public func stop() async {
        await group.triggerGracefulShutdown()
        _ = await task.result
    }
}
