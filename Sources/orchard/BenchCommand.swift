import ArgumentParser

/// `orchard bench`: benchmarks that print one JSON line each (run them from a release build).
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Benchmarks; each prints one JSON line.",
        subcommands: [BenchCoordinator.self]
    )
}
