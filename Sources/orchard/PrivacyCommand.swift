import ArgumentParser
import Foundation
import OrchardBenchmarks
import OrchardPrivacy

/// `orchard privacy`: the RDP accountant from the command line.
struct PrivacyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "privacy",
        abstract: "Differential privacy arithmetic: the ε a DP-FedAvg schedule spends, or the noise a target ε needs.",
        subcommands: [PrivacyEpsilon.self, PrivacyNoise.self]
    )
}

/// Options both subcommands share.
struct PrivacySchedule: ParsableArguments {
    @Option(parsing: .unconditional, help: "The Poisson sampling rate q: devices per cycle / population, in 0...1.")
    var samplingRate: Double

    @Option(parsing: .unconditional, help: "Steps (cycles) composed.")
    var steps: Int

    @Option(parsing: .unconditional, help: "δ of the (ε, δ) guarantee, in (0, 1).")
    var delta: Double

    @Flag(help: "Print one JSON line instead of text.")
    var json = false
}

/// `orchard privacy epsilon`.
struct PrivacyEpsilon: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "epsilon",
        abstract: "ε spent by --steps cycles of the subsampled Gaussian mechanism (RDP accountant, orders 1.1…1024)."
    )

    @OptionGroup var schedule: PrivacySchedule

    @Option(parsing: .unconditional, help: "The noise multiplier z: the noise's standard deviation over the clipping norm.")
    var noiseMultiplier: Double

    struct Output: Encodable {
        var samplingRate: Double
        var noiseMultiplier: Double
        var steps: Int
        var delta: Double
        var epsilon: Double
        var optimalOrder: Double
    }

    func run() async throws {
        let result: (epsilon: Double, order: Double)
        do {
            result = try PrivacyAccountant.epsilon(
                samplingRate: schedule.samplingRate, noiseMultiplier: noiseMultiplier, steps: schedule.steps, delta: schedule.delta)
        } catch {
            throw ValidationError(error.message)
        }
        if schedule.json {
            try JSONLine.write(
                Output(
                    samplingRate: schedule.samplingRate, noiseMultiplier: noiseMultiplier, steps: schedule.steps, delta: schedule.delta,
                    epsilon: result.epsilon, optimalOrder: result.order
                ))
        } else {
            print("ε = \(result.epsilon) at δ = \(schedule.delta) (optimal RDP order \(String(format: "%g", result.order)))")
        }
    }
}

/// `orchard privacy noise`.
struct PrivacyNoise: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "noise",
        abstract: "The smallest noise multiplier with which --steps cycles spend at most --target-epsilon."
    )

    @OptionGroup var schedule: PrivacySchedule

    @Option(parsing: .unconditional, help: "The ε not to exceed.")
    var targetEpsilon: Double

    struct Output: Encodable {
        var samplingRate: Double
        var steps: Int
        var delta: Double
        var targetEpsilon: Double
        var noiseMultiplier: Double
        var epsilon: Double
    }

    func run() async throws {
        let z: Double
        let spent: Double
        do {
            z = try PrivacyAccountant.noiseMultiplier(
                samplingRate: schedule.samplingRate, steps: schedule.steps, delta: schedule.delta, targetEpsilon: targetEpsilon)
            spent = try PrivacyAccountant.epsilon(samplingRate: schedule.samplingRate, noiseMultiplier: z, steps: schedule.steps, delta: schedule.delta).epsilon
        } catch {
            throw ValidationError(error.message)
        }
        if schedule.json {
            try JSONLine.write(
                Output(
                    samplingRate: schedule.samplingRate, steps: schedule.steps, delta: schedule.delta, targetEpsilon: targetEpsilon, noiseMultiplier: z,
                    epsilon: spent))
        } else {
            print("noise multiplier z = \(z) (spends ε = \(spent) at δ = \(schedule.delta))")
        }
    }
}
