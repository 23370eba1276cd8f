import ArgumentParser

/// `orchard bench …`: benchmarks that print one JSON line each (run them from a release build).
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Run a benchmark and print one JSON line of results.",
        subcommands: [BenchTrain.self, BenchGEMM.self, BenchCoordinator.self, BenchSecureAggregation.self, BenchAggregation.self]
    )
}
