import OrchardSupport
import ArgumentParser
import OrchardBenchmarks
import Foundation
import OrchardCoordinator
import OrchardCoordinatorPostgres

/// `orchard bench coordinator`: drives the real HTTP API on loopback and prints one JSON line.
struct BenchCoordinator: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coordinator",
        abstract: "Benchmark the coordinator over loopback HTTP: check-ins/s, report MB/s, latency, peak RSS (MiB).",
        discussion: """
            Starts a coordinator in this process on a free loopback port with a temporary SQLite file, hosts a
            dense model of --params parameters with goal count --devices, then: every device authenticates;
            --devices concurrent devices, each on its own keep-alive connection, send --checkins cycle requests in
            total at --rate per second (open loop; latency is measured from each request's scheduled time, so a
            server that falls behind shows it); then for --rounds cycles every device is admitted to the new cycle,
            one downloads the model, and every device reports a diff (report uploads timed, with
            --report-concurrency in flight). Peak RSS covers server and load generator together.

            With --database postgres://… (or ORCHARD_DATABASE_URL; password from ORCHARD_DATABASE_PASSWORD) it creates
            a temporary database on that server (the role needs CREATEDB), starts --instances coordinators on their own
            loopback ports over it, spreads the devices round-robin across them, and drops the database afterwards.
            """
    )

    @Option(help: "Concurrent devices.")
    var devices = 1000

    @Option(help: "Model parameters.")
    var params = 100_000

    @Option(help: "Cycle requests sent in the check-in phase, across all devices.")
    var checkins = 50_000

    @Option(help: "Check-ins per second offered in the check-in phase (open loop, spread over the devices); 0 sends as fast as possible.")
    var rate = 5000.0

    @Option(help: "Cycles in the report phase (every device reports once per cycle).")
    var rounds = 1

    @Option(help: "Report uploads in flight at once.")
    var reportConcurrency = 32

    @Option(help: "SQLite durability.")
    var durability: SQLiteStore.Durability = .normal

    @Option(
        help:
            "What the check-in phase requests: cycle-request (the real check-in), health (the coordinator's no-op route) or hummingbird (the same requests to a bare Hummingbird application that echoes each body: the floor the HTTP library and the load generator set)."
    )
    var checkinTarget: CoordinatorBenchmark.CheckinTarget = .cycleRequest

    @Option(help: "A PostgreSQL server URL to benchmark on instead of SQLite (a temporary database is created there).")
    var database: String?

    @Option(help: "Coordinator instances over the PostgreSQL database, each on its own loopback port.")
    var instances = 1

    /// The library configuration these options describe.
    var benchmarkConfiguration: CoordinatorBenchmark.Configuration {
        get throws {
            let environment = ProcessInfo.processInfo.environment
            let postgres = try (database ?? environment["ORCHARD_DATABASE_URL"]).map { url in
                do throws(PostgresURLError) {
                    return try PostgresStoreConfiguration(url: url, password: environment["ORCHARD_DATABASE_PASSWORD"])
                } catch {
                    throw ValidationError("--database: \(error.message)")
                }
            }
            return CoordinatorBenchmark.Configuration(
                devices: devices, parameters: params, checkins: checkins, rate: rate, rounds: rounds,
                reportConcurrency: reportConcurrency, durability: durability, checkinTarget: checkinTarget, database: postgres, instances: instances
            )
        }
    }

    /// The option behind each configuration field.
    static let flags = [
        "devices": "--devices", "parameters": "--params", "checkins": "--checkins", "rate": "--rate", "rounds": "--rounds",
        "reportConcurrency": "--report-concurrency", "instances": "--instances", "database": "--database",
    ]

    func validate() throws {
        let configuration = try benchmarkConfiguration
        do throws(BenchmarkError) {
            try configuration.validate()
        } catch {
            throw ValidationError(namingOption(error.message, Self.flags))
        }
    }

    func run() async throws {
        let configuration = try benchmarkConfiguration
        // Progress on standard error, a phase at a time; standard output keeps the one JSON line.
        let progress = ProgressReporter("bench coordinator", total: CoordinatorBenchmark.phases(configuration), unit: "phases")
        try JSONLine.write(try await CoordinatorBenchmark.run(configuration) { done, detail in progress.update(done, detail: detail) })
    }
}
