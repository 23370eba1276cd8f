import ArgumentParser
import Foundation
import Logging
import OrchardBenchmarks
import OrchardCoordinator

/// `orchard serve`: runs the federated-learning coordinator.
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the federated-learning coordinator (HTTP API, cycle timer, SQLite store).",
        discussion: """
            Prints one JSON line to standard output once listening: {"event":"listening","host":…,"port":…}.
            With --port 0 the system picks a free port. The admin token comes from --admin-token or the
            ORCHARD_ADMIN_TOKEN environment variable; without either, a random one is generated and printed in
            that line (development only).
            """
    )

    @Option(help: "The address to bind.")
    var host = "127.0.0.1"

    @Option(help: "The port to listen on (0 picks a free port).")
    var port = 8080

    @Option(help: "The SQLite database: a file path or a sqlite:// / file:// URL.")
    var database = "orchard.sqlite"

    @Option(help: "SQLite durability: normal (survives kill -9) or full (fsync every commit, survives power loss).")
    var durability: SQLiteStore.Durability = .normal

    @Option(help: "The admin API's bearer token.")
    var adminToken: String?

    @Option(help: "The largest report body accepted, in bytes.")
    var maxReportBytes = 256 << 20

    @Option(help: "Reports folded in memory before the running sum is written back.")
    var foldInterval = 32

    @Option(help: "The lowest level logged (to standard error).")
    var logLevel: Logger.Level = .info

    func validate() throws {
        guard (0...65_535).contains(port) else { throw ValidationError("--port must be in 0...65535") }
        guard maxReportBytes > 0, foldInterval > 0 else { throw ValidationError("--max-report-bytes and --fold-interval must be positive") }
        _ = try databasePath()
    }

    /// Resolves `--database` to a file path.
    func databasePath() throws -> String {
        if database.hasPrefix("sqlite://") { return String(database.dropFirst("sqlite://".count)) }
        if database.hasPrefix("file://") {
            guard let url = URL(string: database), url.isFileURL else { throw ValidationError("--database '\(database)' is not a file URL") }
            return url.path
        }
        if database.contains("://") {
            throw ValidationError("--database '\(database)': only SQLite (a path, sqlite:// or file:// URL) is supported")
        }
        return database
    }

    func run() async throws {
        let level = logLevel
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let environmentToken = ProcessInfo.processInfo.environment["ORCHARD_ADMIN_TOKEN"]
        let generated = adminToken == nil && environmentToken == nil
        var rng = SystemRandomNumberGenerator()
        let token = adminToken ?? environmentToken ?? (0..<24).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &rng)) }.joined()
        let instance = try await CoordinatorInstance.open(
            database: try databasePath(), durability: durability,
            configuration: CoordinatorConfiguration(adminToken: token, maximumReportBytes: maxReportBytes, foldInterval: foldInterval),
            logger: Logger(label: "orchard.coordinator")
        )
        let host = self.host
        try await instance.run(host: host, port: port, logger: Logger(label: "orchard.http")) { boundPort in
            try? JSONLine.write(Listening(host: host, port: boundPort, adminToken: generated ? token : nil))
        }
    }

    /// The line `orchard serve` prints once it listens.
    struct Listening: Encodable {
        var event = "listening"
        var host: String
        var port: Int
        var adminToken: String?
    }
}
