import ArgumentParser
import OrchardBenchmarks

/// `orchard bench secure-aggregation`: one secure-aggregation cycle's cost against the plain protocol's.
struct BenchSecureAggregation: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "secure-aggregation",
        abstract: "Time one secure-aggregation cycle against plain reports for the same devices; print the ratios as one JSON line.",
        discussion: """
            Client CPU per device, server CPU per cycle, bytes per device each way (the wire encoding included; the model \
            download, the same in both, is left out and printed as model_bytes). Every ratio is secure / plain.
            """
    )

    @Option(parsing: .unconditional, help: "Devices in the cycle.")
    var devices: Int = 100

    @Option(parsing: .unconditional, help: "Coordinates of each update (199210: the Fashion-MNIST 2NN).")
    var params: Int = 199_210

    @Option(parsing: .unconditional, help: "Neighbours per device, even (SecAgg+); default every other device (SecAgg).")
    var shares: Int?

    @Option(parsing: .unconditional, help: "Shares needed to unmask (default: just above half the neighbours).")
    var threshold: Int?

    @Option(parsing: .unconditional, help: "Probability that a device goes away before each stage after advertise_keys.")
    var dropout: Double = 0

    @Option(parsing: .unconditional, help: "Seed of the updates and the dropouts.")
    var seed: UInt64 = 1

    func validate() throws {
        guard devices >= 3, params >= 1 else { throw ValidationError("--devices must be at least 3 and --params at least 1") }
        guard (0..<1).contains(dropout) else { throw ValidationError("--dropout must be in [0, 1), not \(dropout)") }
    }

    func run() throws {
        let result = try SecureAggregationBenchmark.run(
            .init(devices: devices, parameters: params, shares: shares, threshold: threshold, dropout: dropout, seed: seed))
        try JSONLine.write(result)
    }
}
