import ArgumentParser
import Foundation
import OrchardBenchmarks
import OrchardCoordinator
import OrchardProtocol
import OrchardSupport

/// `orchard bench aggregation`: the coordinator's cost per report of FedAvg's running sum against each robust rule.
struct BenchAggregation: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "aggregation",
        abstract: "Time the coordinator's aggregation per report: FedAvg's running sum against median, trimmed mean and Multi-Krum; print one JSON line.",
        discussion: """
            Seeded diffs of --params values are aggregated --reports at a time, the median of --repeats runs reported. \
            FedAvg folds each diff into a running sum as it arrives; a robust rule writes each into the cycle's scratch \
            file and aggregates them when the cycle closes (trimmed mean cuts 20 % from each end; Multi-Krum assumes 20 % \
            of the reports bad). Reading the diffs from the store is not included, as it costs the same for every rule.
            """
    )

    @Option(parsing: .unconditional, help: "Reports per cycle.")
    var reports: Int = 20

    @Option(parsing: .unconditional, help: "Values per diff (default: the Fashion-MNIST 2NN's 199,210).")
    var params: Int = 199_210

    @Option(parsing: .unconditional, help: "Timed runs per rule; the median is reported.")
    var repeats: Int = 5

    struct Line: Encodable {
        var benchmark = "aggregation"
        var reports: Int
        var params: Int
        var fedavgMicrosecondsPerReport: Double
        var medianMicrosecondsPerReport: Double
        var trimmedMeanMicrosecondsPerReport: Double
        var multiKrumMicrosecondsPerReport: Double
        var medianRatio: Double
        var trimmedMeanRatio: Double
        var multiKrumRatio: Double
    }

    func validate() throws {
        guard reports >= 5 else { throw ValidationError("--reports must be at least 5 (Multi-Krum with f = 20 % needs f + 3), not \(reports)") }
        guard params >= 1 else { throw ValidationError("--params must be at least 1, not \(params)") }
        guard repeats >= 1 else { throw ValidationError("--repeats must be at least 1, not \(repeats)") }
    }

    func run() async throws {
        var random = OrchardRandom(seed: 1)
        let diffs: [[UInt8]] = (0..<reports).map { _ in
            let values = (0..<params).map { _ in random.nextFloat() - 0.5 }
            return values.withUnsafeBytes { Array($0) }
        }
        func median(_ body: () throws -> Void) rethrows -> Double {
            var times: [Double] = []
            for _ in 0..<repeats {
                let start = ContinuousClock.now
                try body()
                times.append((ContinuousClock.now - start).inSeconds)
            }
            return times.sorted()[times.count / 2] / Double(reports) * 1e6
        }
        let fedAvg = median {
            var sum = RunningSum(count: params)
            for diff in diffs { sum.add(bytes: diff, weight: 1) }
            _ = sum.mean()
        }
        let f = max(1, reports / 5)
        func robust(_ rule: RobustAggregationConfig) throws -> Double {
            try median {
                let matrix = try ReportMatrix(columns: params)
                for (index, diff) in diffs.enumerated() { try matrix.append(diff, worker: "w\(index)", sampleCount: 1) }
                _ = try rule.aggregate(matrix)
            }
        }
        let medianCost = try robust(.median)
        let trimmedCost = try robust(.trimmedMean(trim: 0.2))
        let krumCost = try robust(.multiKrum(byzantine: f))
        try JSONLine.write(
            Line(
                reports: reports, params: params, fedavgMicrosecondsPerReport: fedAvg, medianMicrosecondsPerReport: medianCost,
                trimmedMeanMicrosecondsPerReport: trimmedCost, multiKrumMicrosecondsPerReport: krumCost, medianRatio: medianCost / fedAvg,
                trimmedMeanRatio: trimmedCost / fedAvg, multiKrumRatio: krumCost / fedAvg))
    }
}
