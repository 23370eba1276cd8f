import ArgumentParser
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import Logging
import OrchardBenchmarks
import OrchardCoordinator
import OrchardCoordinatorPostgres
import OrchardOperator
import OrchardSupport

/// `orchard serve`: runs the federated-learning coordinator.
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the federated-learning coordinator (HTTP API, cycle timer, SQLite or PostgreSQL store).",
        discussion: """
            Prints one JSON line to standard output once listening: {"event":"listening","scheme":…,"host":…,"port":…,
            "dashboard_url":…}; the dashboard URL carries a one-time login token (24 h) for the dashboard at /dashboard.
            With --port 0 the system picks a free port. With --tls-cert and --tls-key (PEM files: the certificate
            chain, leaf first, and its unencrypted private key) it serves HTTPS only; devices trust a private CA with
            --ca-cert. The admin token comes from --admin-token-file (a file
            holding it) or the ORCHARD_ADMIN_TOKEN environment variable, never both; without either, a random one
            is generated and printed in that line (development only). --admin-token still works but is deprecated:
            a token on the command line is visible to every local user. A second coordinator on the same SQLite
            database is refused (the lock file <database>.lock is held while one runs).

            With a PostgreSQL URL (--database postgres://user@host:port/db?sslmode=verify-full&sslrootcert=ca.pem, or
            the ORCHARD_DATABASE_URL environment variable) several instances serve one federation: give each a
            distinct, stable --instance-id. The database password comes from --database-password-file or
            ORCHARD_DATABASE_PASSWORD; a password inside a URL on the command line works but is warned about.

            Processes in open authentication mode (development only: every call registers a worker) are limited
            per client address (--open-auth-burst calls at once, then --open-auth-per-second; beyond it 429 with
            Retry-After) and in workers (--max-open-workers; beyond it 403 worker_limit_reached). A device may run
            one speed test per direction per --speed-test-interval seconds.
            """
    )

    /// The library's defaults, which the options' defaults repeat rather than restate.
    static let defaults = CoordinatorConfiguration()

    @Option(help: "The address to bind.")
    var host = "127.0.0.1"

    @Option(help: "The port to listen on (0 picks a free port).")
    var port = 8080

    @Option(help: "The database: a SQLite file path or sqlite:// / file:// URL, or a postgres:// URL (default: ORCHARD_DATABASE_URL, else orchard.sqlite).")
    var database: String?

    @Option(help: "A file holding the PostgreSQL password (else ORCHARD_DATABASE_PASSWORD, else the URL's).")
    var databasePasswordFile: String?

    @Option(help: "This instance's name among coordinators sharing a PostgreSQL database: unique and stable across restarts (default: <hostname>-<port>).")
    var instanceID: String?

    @Option(parsing: .unconditional, help: "Seconds a cycle may stay sealed by an instance that stopped answering before another closes it (PostgreSQL).")
    var sealLease: Double = Self.defaults.sealLease.inSeconds

    @Option(help: "SQLite durability: normal (survives kill -9) or full (fsync every commit, survives power loss).")
    var durability: SQLiteStore.Durability = .normal

    @Option(help: "A file holding the admin API's bearer token (surrounding whitespace is ignored).")
    var adminTokenFile: String?

    @Option(help: "Deprecated: the admin token on the command line, where every local user can read it; use --admin-token-file or ORCHARD_ADMIN_TOKEN.")
    var adminToken: String?

    @Option(help: "The largest report body accepted, in bytes.")
    var maxReportBytes = Self.defaults.maximumReportBytes

    @Option(help: "Reports folded in memory before the running sum is written back.")
    var foldInterval = Self.defaults.foldInterval

    @Option(help: "Report uploads received at once; one more gets 503 too_many_uploads with Retry-After.")
    var maxUploadsInFlight = Self.defaults.maximumUploadsInFlight

    @Option(help: "Seconds a device turned away by --max-uploads-in-flight is told to wait (Retry-After).")
    var uploadRetryAfter = Int(Self.defaults.uploadRetryAfter.components.seconds)

    @Option(help: "Seconds a connection may send nothing before it is closed (an idle keep-alive, or an upload stalled mid-body, which is abandoned).")
    var connectionIdleTimeout: Double = Self.defaults.connectionIdleTimeout?.inSeconds ?? 30

    @Option(help: ArgumentHelp("The TLS certificate chain (PEM, leaf first); serves HTTPS. Needs --tls-key.", valueName: "pem"))
    var tlsCert: String?

    @Option(help: ArgumentHelp("The TLS certificate's private key (PEM, unencrypted). Needs --tls-cert.", valueName: "pem"))
    var tlsKey: String?

    @Option(help: "Authentications one client address may make at once to open-mode processes.")
    var openAuthBurst = CoordinatorConfiguration.defaultOpenAuthenticationRate.burst

    @Option(help: "Authentications per second one client address may make over time to open-mode processes (0: no limit).")
    var openAuthPerSecond = CoordinatorConfiguration.defaultOpenAuthenticationRate.perSecond

    @Option(help: "Workers one open-mode process may register (0: no cap).")
    var maxOpenWorkers = CoordinatorConfiguration.defaultMaximumOpenWorkers

    @Option(parsing: .unconditional, help: "Seconds between two speed tests in the same direction by one device (0: no limit).")
    var speedTestInterval: Double = Self.defaults.speedTestInterval.inSeconds

    @Option(help: "The lowest level logged (to standard error).")
    var logLevel: Logger.Level = .info

    func validate() throws {
        guard (0...65_535).contains(port) else { throw ValidationError("--port must be in 0...65535") }
        guard maxReportBytes > 0, foldInterval > 0 else { throw ValidationError("--max-report-bytes and --fold-interval must be positive") }
        guard maxUploadsInFlight > 0 else { throw ValidationError("--max-uploads-in-flight must be positive") }
        guard (1...3600).contains(uploadRetryAfter) else { throw ValidationError("--upload-retry-after must be in 1...3600 seconds") }
        guard connectionIdleTimeout > 0, connectionIdleTimeout <= 86_400 else {
            throw ValidationError("--connection-idle-timeout must be a positive number of seconds up to 86400 (a day)")
        }
        switch (tlsCert, tlsKey) {
        case (nil, .some): throw ValidationError("--tls-key needs --tls-cert: give both to serve HTTPS, or neither for HTTP")
        case (.some, nil): throw ValidationError("--tls-cert needs --tls-key: give both to serve HTTPS, or neither for HTTP")
        default: break
        }
        guard openAuthBurst >= 1 else { throw ValidationError("--open-auth-burst must be at least 1") }
        guard openAuthPerSecond >= 0, openAuthPerSecond.isFinite else { throw ValidationError("--open-auth-per-second must be a non-negative number") }
        guard maxOpenWorkers >= 0 else { throw ValidationError("--max-open-workers must be non-negative (0: no cap)") }
        guard speedTestInterval >= 0, speedTestInterval.isFinite else {
            throw ValidationError("--speed-test-interval must be a non-negative number of seconds")
        }
        guard sealLease > 0, sealLease.isFinite else { throw ValidationError("--seal-lease must be a positive number of seconds") }
        _ = try databaseLocation()
        if let failure = CoordinatorConfiguration(instanceID: resolvedInstanceID(), sealLease: .seconds(sealLease)).validationFailure() {
            throw ValidationError(namingOption(failure, ["instanceID": "--instance-id", "sealLease": "--seal-lease"]))
        }
        // A busy port is found before the database is opened, so it leaves no files behind.
        if port != 0, Self.addressInUse(host: host, port: port) {
            throw CommandFailure(code: "address_in_use", message: Self.portInUse(host: host, port: port))
        }
    }

    /// Where the coordinator keeps its state.
    enum DatabaseLocation {
        /// A SQLite file.
        case sqlite(String)
        /// A PostgreSQL database; `passwordOnCommandLine` when the URL given with `--database` carries the password.
        case postgres(PostgresStoreConfiguration, passwordOnCommandLine: Bool)
    }

    /// Resolves `--database` (or ORCHARD_DATABASE_URL) and the PostgreSQL password.
    func databaseLocation(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> DatabaseLocation {
        let text = database ?? environment["ORCHARD_DATABASE_URL"] ?? "orchard.sqlite"
        let option = database == nil ? "ORCHARD_DATABASE_URL" : "--database"
        let lowered = text.lowercased()
        if lowered.hasPrefix("postgres://") || lowered.hasPrefix("postgresql://") {
            var password: String?
            if let databasePasswordFile {
                guard let contents = FileManager.default.contents(atPath: databasePasswordFile) else {
                    throw ValidationError("--database-password-file '\(databasePasswordFile)' cannot be read")
                }
                password = String(decoding: contents, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
                if password?.isEmpty ?? true { throw ValidationError("--database-password-file '\(databasePasswordFile)' is empty") }
            } else if let fromEnvironment = environment["ORCHARD_DATABASE_PASSWORD"], !fromEnvironment.isEmpty {
                password = fromEnvironment
            }
            let configuration: PostgresStoreConfiguration
            do throws(PostgresURLError) {
                configuration = try PostgresStoreConfiguration(url: text, password: password)
            } catch {
                throw ValidationError("\(option): \(error.message)")
            }
            if let problem = configuration.problem { throw ValidationError("\(option) \(configuration): \(problem)") }
            let urlPassword = (try? PostgresStoreConfiguration(url: text))?.password != nil
            return .postgres(configuration, passwordOnCommandLine: database != nil && urlPassword && password == nil)
        }
        if databasePasswordFile != nil { throw ValidationError("--database-password-file is for a PostgreSQL database; \(option) names a SQLite file") }
        if lowered.hasPrefix("sqlite://") { return .sqlite(String(text.dropFirst("sqlite://".count))) }
        if lowered.hasPrefix("file://") {
            guard let url = URL(string: text), url.isFileURL else { throw ValidationError("\(option) '\(text)' is not a file URL") }
            return .sqlite(url.path)
        }
        if text.contains("://") {
            throw ValidationError("\(option) '\(text)': use a SQLite path, a sqlite:// or file:// URL, or a postgres:// URL")
        }
        return .sqlite(text)
    }

    /// `--instance-id`, or `<hostname>-<port>` with characters an instance name cannot hold replaced by `-`.
    func resolvedInstanceID() -> String {
        instanceID ?? CoordinatorConfiguration.defaultInstanceID(hostName: ProcessInfo.processInfo.hostName, port: port)
    }

    func run() async throws {
        bootstrapStandardErrorLogging(level: logLevel)
        // The key is read before anything else starts, so a bad file stops `orchard serve` with its reason.
        let tls: CoordinatorTLS?
        if let tlsCert, let tlsKey {
            do throws(CoordinatorError) {
                tls = try CoordinatorTLS.load(certificateFile: tlsCert, privateKeyFile: tlsKey)
            } catch {
                throw ValidationError(namingOption(error.message, ["TLS certificate file": "--tls-cert", "TLS private key file": "--tls-key"]))
            }
        } else {
            tls = nil
        }
        let resolved = try AdminTokenSource.resolve(
            file: adminTokenFile, environment: ProcessInfo.processInfo.environment[AdminTokenSource.environmentVariable], argument: adminToken
        )
        let logger = Logger(label: "orchard.serve")
        for warning in resolved.warnings { logger.warning("\(warning)") }
        var rng = SystemRandomNumberGenerator()
        let generated = resolved.token == nil
        let token = resolved.token ?? (0..<24).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &rng)) }.joined()
        let configuration = CoordinatorConfiguration(
            adminToken: token, maximumReportBytes: maxReportBytes, foldInterval: foldInterval,
            openAuthenticationRate: openAuthPerSecond > 0 ? RateLimit(burst: openAuthBurst, perSecond: openAuthPerSecond) : nil,
            maximumOpenWorkers: maxOpenWorkers > 0 ? maxOpenWorkers : nil, speedTestInterval: .seconds(speedTestInterval),
            maximumUploadsInFlight: maxUploadsInFlight, uploadRetryAfter: .seconds(uploadRetryAfter), connectionIdleTimeout: .seconds(connectionIdleTimeout),
            instanceID: resolvedInstanceID(), sealLease: .seconds(sealLease)
        )
        if let failure = configuration.validationFailure() {
            throw ValidationError(
                namingOption(failure, ["instanceID": "--instance-id", "sealLease": "--seal-lease", "maximumUploadsInFlight": "--max-uploads-in-flight"]))
        }
        let instance: CoordinatorInstance
        switch try databaseLocation() {
        case .sqlite(let path):
            instance = try await CoordinatorInstance.open(
                database: path, durability: durability, configuration: configuration, logger: Logger(label: "orchard.coordinator"))
        case .postgres(let database, let passwordOnCommandLine):
            if passwordOnCommandLine {
                logger.warning(
                    "the database password is in the --database URL, where every local user can read it; use --database-password-file or ORCHARD_DATABASE_PASSWORD"
                )
            }
            logger.info("opening the PostgreSQL store", metadata: ["database": "\(database)", "instance": "\(configuration.instanceID)"])
            let store = try await PostgresStore.open(configuration: database, logger: Logger(label: "orchard.postgres"))
            instance = try await CoordinatorInstance.open(
                store: store, configuration: configuration, logger: Logger(label: "orchard.coordinator"), release: { await store.shutdown() }
            )
        }
        let host = self.host
        let scheme = tls == nil ? "http" : "https"
        do {
            try await instance.run(host: host, port: port, tls: tls, logger: Logger(label: "orchard.http")) { boundPort in
                // A one-time login URL for the dashboard (as Jupyter prints one); printed here only, never logged.
                let login = Dashboard.loginURL(base: "\(scheme)://\(Serve.urlHost(host)):\(boundPort)", token: instance.dashboard.issueLoginToken())
                try? JSONLine.write(Listening(scheme: scheme, host: host, port: boundPort, adminToken: generated ? token : nil, dashboardURL: login))
            }
        } catch {
            await instance.shutdown()
            // Taken between the check above and the bind.
            if "\(error)".contains("Address already in use") { throw CommandFailure(code: "address_in_use", message: Self.portInUse(host: host, port: port)) }
            throw error
        }
        await instance.shutdown()
    }

    static func portInUse(host: String, port: Int) -> String {
        "--port \(port): \(host):\(port) is already in use (another orchard serve?); choose another port, or --port 0 for a free one"
    }

    /// Whether binding `host:port` fails because the address is taken (false when it binds, or fails otherwise: the
    /// server's own bind then reports that).
    static func addressInUse(host: String, port: Int) -> Bool {
        var hints = addrinfo()
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &list) == 0, let first = list else { return false }
        defer { freeaddrinfo(list) }
        let fd = socket(first.pointee.ai_family, first.pointee.ai_socktype, first.pointee.ai_protocol)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        return bind(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) != 0 && errno == EADDRINUSE
    }

    /// The line `orchard serve` prints once it listens (the admin token only when it was generated).
    struct Listening: Encodable {
        var event = "listening"
        var scheme: String
        var host: String
        var port: Int
        var adminToken: String?
        var dashboardURL: String?
    }

    /// The host of a URL to this server: a wildcard address is reached on loopback; an IPv6 address is bracketed.
    static func urlHost(_ host: String) -> String {
        switch host {
        case "0.0.0.0", "": return "127.0.0.1"
        case "::", "[::]": return "[::1]"
        default: return host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        }
    }
}
