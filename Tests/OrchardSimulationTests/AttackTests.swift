import Foundation
import OrchardClient
import OrchardFormats
import OrchardML
import OrchardProtocol
import OrchardData
import OrchardSupport
import OrchardTesting
import Testing
@testable import OrchardSimulation

/// Poisoning devices (`--attackers`, `--attack`, `--attack-scale`) and the robust rules that resist them (`--robust-aggregation`).
@Suite struct AttackTests {
    @Test func robustRulesParse() throws {
        #expect(try RobustAggregationConfig(parsing: "median") == .median)
        #expect(try RobustAggregationConfig(parsing: "trimmed-mean:0.1") == .trimmedMean(trim: 0.1))
        #expect(try RobustAggregationConfig(parsing: "trimmed_mean:0.25") == .trimmedMean(trim: 0.25))
        #expect(try RobustAggregationConfig(parsing: "multi-krum:2") == .multiKrum(byzantine: 2))
        #expect(try RobustAggregationConfig(parsing: "Multi-Krum:2:5") == .multiKrum(byzantine: 2, selected: 5))
        for bad in [
            "", "mean", "median:1", "trimmed-mean", "trimmed-mean:0", "trimmed-mean:0.5", "trimmed-mean:x", "multi-krum", "multi-krum:-1", "multi-krum:1:0",
            "multi-krum:1:2:3",
        ] {
            #expect(throws: SimulationError.self, "\(bad)") { try RobustAggregationConfig(parsing: bad) }
        }
    }

    @Test func attackersAreARoundedSeededShareOfTheFleet() {
        let attack = AttackConfiguration(fraction: 0.2, kind: .signFlip)
        let chosen = attack.attackers(clients: 100, seed: 7)
        #expect(chosen.count == 20 && chosen.allSatisfy { (0..<100).contains($0) })
        #expect(attack.attackers(clients: 100, seed: 7) == chosen)
        #expect(attack.attackers(clients: 100, seed: 8) != chosen)
        #expect(AttackConfiguration(fraction: 0.25, kind: .scaled).attackers(clients: 10, seed: 1).count == 3)  // 2.5 rounds to 3
        #expect(attack.scale == 10 && AttackConfiguration(fraction: 0.2, kind: .gaussian).scale == 1)
        #expect(attack.summary == "sign-flip x10 by 20 % of the devices")
        #expect(AttackConfiguration(fraction: 0.05, kind: .gaussian, scale: 0.5).summary == "gaussian sigma 0.5 by 5 % of the devices")
    }

    static let spec = ModelSpec(
        name: "tiny", inputs: [InputSpec(name: "x", shape: [2])],
        layers: [
            LayerSpec(name: "embed", type: .dense, inputs: ["x"], frozen: true, units: 2, inputSize: 2, useBias: false),
            LayerSpec(name: "out", type: .dense, inputs: ["embed"], units: 2, inputSize: 2, useBias: true),
        ])

    static func update() -> (LocalUpdate, LocalTrainingTask) {
        let diff = [
            TensorRecord(name: "embed.weight", shape: [2, 2], values: [0, 0, 0, 0]),
            TensorRecord(name: "out.weight", shape: [2, 2], values: [1, -2, 3, 0.5]),
            TensorRecord(name: "out.bias", shape: [2], values: [0.25, -1]),
        ]
        let task = LocalTrainingTask(model: CycleModel(spec: spec, weights: diff), training: TrainingConfiguration(seed: 11))
        return (LocalUpdate(diff: diff, sampleCount: 4, metrics: ["loss": 1]), task)
    }

    @Test func signFlipAndScaledMultiplyTheTrainableDiff() {
        let (honest, task) = Self.update()
        let flipped = AttackConfiguration(fraction: 0.1, kind: .signFlip, scale: 3).poison(honest, task: task, device: 0)
        #expect(flipped.diff.map(\.values) == [[0, 0, 0, 0], [-3, 6, -9, -1.5], [-0.75, 3]])
        #expect(flipped.sampleCount == 4 && flipped.metrics == ["loss": 1])
        let scaled = AttackConfiguration(fraction: 0.1, kind: .scaled, scale: 2).poison(honest, task: task, device: 0)
        #expect(scaled.diff.map(\.values) == [[0, 0, 0, 0], [2, -4, 6, 1], [0.5, -2]])
    }

    @Test func gaussianNoiseIsSeededAndLeavesFrozenLayersAlone() {
        let (honest, task) = Self.update()
        let attack = AttackConfiguration(fraction: 0.1, kind: .gaussian, scale: 100)
        let noised = attack.poison(honest, task: task, device: 3)
        #expect(noised.diff[0].values == [0, 0, 0, 0])
        #expect(noised.diff[1].values != honest.diff[1].values && noised.diff[1].values.contains { abs($0) > 10 })
        #expect(attack.poison(honest, task: task, device: 3).diff.map(\.values) == noised.diff.map(\.values))
        #expect(attack.poison(honest, task: task, device: 4).diff.map(\.values) != noised.diff.map(\.values))
    }

    @Test func labelFlipMapsEachClassToItsMirror() throws {
        let data = try TensorDataset(inputs: ["x": Tensor(shape: [3, 2], scalars: [0, 1, 2, 3, 4, 5])], targets: Tensor(shape: [3, 1], scalars: [0, 3, 9]))
        let flipped = LabelFlippedDataset(base: data, classes: 10)
        var target: [Float] = [0]
        var input: [Float] = [0, 0]
        let labels = (0..<3).map { index -> Float in
            target.withUnsafeMutableBufferPointer { flipped.copyTarget(of: index, into: $0) }
            return target[0]
        }
        #expect(labels == [9, 6, 0])
        input.withUnsafeMutableBufferPointer { flipped.copyInput(0, of: 1, into: $0) }
        #expect(input == [2, 3])
    }

    @Test func multiKrumRaisesTheMinimumReportsToWhatTheRuleNeeds() throws {
        var c = SimulationConfiguration.images(.fashionMNIST)
        c.fraction = 0.2  // goal 20, half of it 10
        #expect(c.minimumReports == 10)
        c.robustAggregation = .multiKrum(byzantine: 8)
        #expect(c.minimumReports == 11)
        c.robustAggregation = .multiKrum(byzantine: 4, selected: 12)
        #expect(c.minimumReports == 16)
        try c.validate()
        c.robustAggregation = .multiKrum(byzantine: 10, selected: 12)
        #expect(throws: SimulationError.self) { try c.validate() }
    }
}

/// A poisoned housing fleet with and without a robust rule, in memory (deterministic for the seed).
@Suite(.serialized) struct PoisonedFleetTests {
    static func run(attack: AttackConfiguration?, robust: RobustAggregationConfig?, rounds: Int = 6, check: (URL) throws -> Void = { _ in }) async throws
        -> SimulationResult
    {
        let directory = SimulationRunnerTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        var c = SimulationRunnerTests.configuration(transport: .memory, directory: directory)
        c.rounds = rounds
        c.dropout = 0
        // Every device available, so the attackers take part in the rounds (diurnal routines may keep two devices out of six).
        c.availability = .always
        c.attack = attack
        c.robustAggregation = robust
        let result = try await SimulationRunner.run(c, progress: SimulationRunnerTests.quiet, clock: ManualClock())
        try check(directory)
        return result
    }

    /// Label-flipping devices train on Fashion-MNIST with every label c mapped to 9 − c (the classes come from the
    /// model's output), through the whole runner.
    @Test(
        SystemDatasets.requirement(
            file: IDXImageDataset.fashionMNISTDirectory.appendingPathComponent("train-images-idx3-ubyte.gz").path, package: "dataset-fashion-mnist"))
    func labelFlippersTrainOnMirroredLabels() async throws {
        let directory = SimulationRunnerTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        var c = SimulationConfiguration.images(.fashionMNIST)
        c.clients = 10
        c.fraction = 0.5
        c.rounds = 1
        c.transport = .memory
        c.output = directory
        c.partition = .sampled(perClient: 20)
        c.attack = AttackConfiguration(fraction: 0.5, kind: .labelFlip)
        let result = try await SimulationRunner.run(c, progress: SimulationRunnerTests.quiet, clock: ManualClock())
        #expect(result.rounds.first?.participants == 5 && result.summary.diverged == nil)
        #expect(result.summary.settings["attack"] == "label-flip by 50 % of the devices")
    }

    /// Poison far out of range: the global model's values overflow, devices' local training yields NaN, and they send
    /// nothing. The run goes on to its end and says so; the metrics file carries the non-finite test loss as "NaN".
    @Test func aDivergedModelIsReportedNotFatal() async throws {
        let attack = AttackConfiguration(fraction: 0.3, kind: .scaled, scale: 1e30)
        let result = try await Self.run(attack: attack, robust: nil, rounds: 3) { directory in
            let metrics = try ReportWriter.readMetrics(directory.appendingPathComponent("metrics.jsonl"))
            #expect(metrics.count == 3 && metrics.contains { $0.testRMSE?.isNaN == true })
            #expect(try String(contentsOf: directory.appendingPathComponent("metrics.jsonl"), encoding: .utf8).contains(#""test_rmse":"NaN""#))
        }
        #expect((result.summary.diverged ?? 0) > 0)
        #expect(result.rounds.contains { ($0.diverged ?? 0) > 0 && $0.dropouts >= ($0.diverged ?? 0) })
        #expect(result.summary.shortfall?.contains("local training from the global model diverged") == true)
    }

    @Test func theMedianHoldsWhereFedAvgIsThrownOff() async throws {
        let attack = AttackConfiguration(fraction: 0.2, kind: .signFlip, scale: 10)
        let clean = try await Self.run(attack: nil, robust: nil)
        let poisoned = try await Self.run(attack: attack, robust: nil)
        let defended = try await Self.run(attack: attack, robust: .median)
        let cleanRMSE = try #require(clean.summary.final.rmse)
        let poisonedRMSE = try #require(poisoned.summary.final.rmse)
        let defendedRMSE = try #require(defended.summary.final.rmse)
        #expect(poisonedRMSE > 1.5 * cleanRMSE, "FedAvg under attack \(poisonedRMSE), clean \(cleanRMSE)")
        #expect(defendedRMSE < 1.2 * cleanRMSE, "median under attack \(defendedRMSE), clean \(cleanRMSE)")
        #expect(defended.summary.settings["robust_aggregation"] == "median")
        #expect(defended.summary.settings["attack"] == "sign-flip x10 by 20 % of the devices")
        #expect(clean.summary.settings["attack"] == nil)
    }
}
