import Foundation
import OrchardData
import OrchardClient
import OrchardFormats
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import Testing
@testable import OrchardSimulation

/// `orchard simulate --holdout-fraction F --evaluation-goal G`: every virtual device holds its samples out by its own
/// seed, evaluates the round's starting checkpoint through the real client and wire, and the coordinator's aggregate
/// is the sample-weighted mean of what each device measures.
@Suite(.serialized) struct FederatedEvaluationSimulationTests {
    static func configuration(directory: URL) -> SimulationConfiguration {
        var c = SimulationConfiguration.housing
        c.clients = 8
        c.rounds = 3
        c.transport = .memory
        c.seed = 5
        c.output = directory
        c.availability = .always
        c.dropout = 0
        c.turnedAway = .fullStack
        c.holdoutFraction = 0.25
        c.federatedEvaluation = FederatedEvaluationConfig(goal: 8)
        return c
    }

    /// The seed a virtual device splits its samples with (its SDK's training seed).
    static func deviceSeed(_ c: SimulationConfiguration, _ device: Int) -> UInt64 {
        var random = OrchardRandom.derived(seed: c.seed ^ 0x7EA1_7123, stream: UInt64(device))
        return random.next()
    }

    /// Devices of one sample with half held out: some hold their only sample out and have nothing to train on. Each
    /// such device drops out of its round (counted), and the run goes on, instead of failing as a whole.
    @Test func aDeviceWithEverySampleHeldOutDropsOutAndTheRunGoesOn() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-sim-fe-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        var c = Self.configuration(directory: directory)
        c.partition = .sampled(perClient: 1)
        c.holdoutFraction = 0.5
        c.clients = 12
        c.fraction = 1
        c.federatedEvaluation = FederatedEvaluationConfig(goal: 4)
        let result = try await SimulationRunner.run(c, progress: ProgressDisplay(interactive: false) { _ in }, clock: ManualClock())
        #expect(result.rounds.count == 3)
        #expect(result.rounds.contains { $0.dropouts > 0 }, "\(result.rounds.map(\.dropouts))")
        #expect(result.rounds.contains { $0.aggregated })
    }

    @Test func everyDeviceEvaluatesTheStartingCheckpointAndTheAggregateIsTheirWeightedMean() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-sim-fe-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let c = Self.configuration(directory: directory)
        let result = try await SimulationRunner.run(c, progress: ProgressDisplay(interactive: false) { _ in }, clock: ManualClock())
        #expect(result.rounds.count == 3 && result.rounds.allSatisfy(\.aggregated))
        for (index, round) in result.rounds.enumerated() {
            let evaluation = try #require(round.federatedEvaluation, "round \(round.round)")
            #expect(evaluation.checkpoint == index && evaluation.devices == 8)
        }
        // Checkpoint 0, by hand: each device's metrics of the initial weights on its own held-out samples.
        let prepared = try SimulationRunner.prepare(c, progress: ProgressDisplay(interactive: false) { _ in })
        let weights = try Safetensors.decode(prepared.model.weightsSafetensors()).tensors
        let model = CycleModel(spec: prepared.model.spec, weights: weights)
        var loss = 0.0, mae = 0.0, samples = 0
        for device in 0..<c.clients {
            let split = HoldoutSplit(count: prepared.workload.sampleCount(device: device), fraction: 0.25, seed: Self.deviceSeed(c, device))
            let metrics = try prepared.workload.evaluate(device: device, model: model, on: split.holdout)
            loss += metrics.loss * Double(metrics.samples)
            mae += (metrics.values["mae"] ?? .nan) * Double(metrics.samples)
            samples += metrics.samples
        }
        let first = try #require(result.rounds[0].federatedEvaluation)
        #expect(first.samples == samples)
        #expect(abs(first.metrics["loss"]! - loss / Double(samples)) <= 1e-9 * abs(first.metrics["loss"]!))
        #expect(abs(first.metrics["mae"]! - mae / Double(samples)) <= 1e-9 * abs(first.metrics["mae"]!))
        #expect(result.summary.federatedEvaluation == result.rounds.last?.federatedEvaluation)
        let html = try String(contentsOf: directory.appendingPathComponent("report.html"), encoding: .utf8)
        #expect(html.contains("devices&#39; held-out samples (federated)") || html.contains("devices' held-out samples (federated)"))
        // The same seed gives the same evaluations.
        let again = try await SimulationRunner.run(
            Self.configuration(directory: directory.appendingPathComponent("again")), progress: ProgressDisplay(interactive: false) { _ in },
            clock: ManualClock())
        #expect(again.rounds.map(\.withoutTiming) == result.rounds.map(\.withoutTiming))
    }

    @Test func federatedEvaluationNeedsHeldOutSamplesAndNoSecureAggregation() {
        var c = SimulationConfiguration.housing
        c.federatedEvaluation = FederatedEvaluationConfig(goal: 4)
        #expect(throws: SimulationError.self) { try c.validate() }
        c.holdoutFraction = 0.95
        #expect(throws: SimulationError.self) { try c.validate() }
        c.holdoutFraction = 0.2
        #expect(throws: Never.self) { try c.validate() }
        c.secureAggregation = SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 2))
        #expect(throws: SimulationError.self) { try c.validate() }
    }
}
