import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif
import OrchardClient
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import Testing
@testable import OrchardSimulation

@Suite struct DropoutSpanTests {
    /// With secure aggregation a task's dropout falls during its download and training only: each later stage draws its
    /// own, so a device that went away during the masked input's upload would otherwise have dropped out twice.
    @Test func secureStagesLeaveTheUploadToTheirOwnDraws() throws {
        let profile = DeviceProfile.sample(device: 3, seed: 7, medianSecondsPerUpdate: 0.05)
        let bytes = 800_000, updates = 60
        let download = Double(bytes) / profile.downloadBytesPerSecond, training = Double(updates) * profile.secondsPerUpdate
        let upload = Double(bytes) / profile.uploadBytesPerSecond
        let plain = VirtualDevice.dropoutSpan(modelBytes: bytes, updates: updates, profile: profile, secureStages: false)
        let secure = VirtualDevice.dropoutSpan(modelBytes: bytes, updates: updates, profile: profile, secureStages: true)
        #expect(abs(plain - (download + training + upload)) < 1e-9)
        #expect(abs(secure - (download + training)) < 1e-9)
        #expect(upload > 0 && secure < plain)

        var configuration = SimulationConfiguration(dataset: .housing, seed: 1)
        #expect(!configuration.conditions.secureStages)
        configuration.secureAggregation = SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 5), stageTimeout: 10)
        #expect(configuration.conditions.secureStages)
    }
}

@Suite struct FleetSimulationTests {
    static func workload(devices: Int, updates: Int = 20) -> FakeWorkload {
        FakeWorkload(
            optima: (0..<devices).map { d in [Float(d % 5), Float(d % 3) - 1, 2] },
            samples: (0..<devices).map { 10 + $0 % 7 }, updates: updates, step: 0.1
        )
    }

    @Test func fedAvgOverAFleetConverges() async throws {
        let fleet = FleetSimulation(devices: 20, conditions: FleetConditions(), seed: 3, rounds: 30)
        let (initial, rounds) = try await FleetHarness.run(fleet, workload: Self.workload(devices: 20), goal: 10)
        #expect(rounds.count == 30)
        #expect(rounds.allSatisfy { $0.aggregated && $0.participants == 10 && $0.selected == 10 })
        #expect(try #require(rounds.last!.testLoss) < initial.loss / 20)
        #expect(rounds.map(\.virtualStart) == rounds.map(\.virtualStart).sorted())
    }

    /// Under secure aggregation a cycle can close inside a device's call that finds a stage past its deadline (the
    /// coordinator closes the stage, abandons or aggregates, and opens the next cycle at once). The round ends there,
    /// so the next round runs the whole of the next cycle, and the round's record says whether it aggregated. A cycle
    /// whose devices stopped calling closes at its stage's deadline, and its round ends there too.
    @Test("a secure cycle ends its round where it closed (during a device's call or by a stage's timer), and the next cycle is the next round's")
    func secureCyclesEndTheirRoundWhereTheyClosed() async throws {
        var conditions = FleetConditions()
        conditions.dropout = 0.2
        conditions.secureStages = true
        let fleet = FleetSimulation(devices: 20, conditions: conditions, seed: 5, rounds: 12)
        let cycleSeconds = 300.0
        nonisolated(unsafe) var records: [CycleRecord] = []
        let (_, rounds) = try await FleetHarness.run(
            fleet, workload: Self.workload(devices: 20), goal: 10, cycleSeconds: cycleSeconds, minimumReports: 6,
            secure: SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 5), stageTimeout: 10), cycles: { records = $0 }
        )
        #expect(rounds.count == 12)
        #expect(records.map(\.cycle) == Array(1...12), "one cycle a round")
        #expect(records.contains { $0.outcome == .abandoned } && records.contains { $0.outcome == .aggregated }, "both outcomes occur with this seed")
        let base = try #require(records.first?.openedAt)
        for (round, cycle) in zip(rounds, records) {
            #expect((cycle.outcome == .aggregated) == round.aggregated, "round \(round.round)")
            let opened = try #require(cycle.openedAt) - base
            #expect(abs(opened - round.virtualStart) < 1, "round \(round.round) starts at \(round.virtualStart) s, its cycle opened at \(opened) s")
            // A round whose devices stopped calling (one went away mid-stage) ends where the stage's timer closed the
            // cycle, not at the round's deadline.
            let closed = try #require(cycle.closedAt) - base
            #expect(abs(closed - round.virtualEnd) < 1, "round \(round.round) ends at \(round.virtualEnd) s, its cycle closed at \(closed) s")
            #expect(round.virtualEnd < opened + cycleSeconds, "round \(round.round) ran to its cycle's deadline")
        }
    }

    @Test func evaluatesEveryNthRoundAndTheLast() async throws {
        let every = FleetSimulation(devices: 20, seed: 3, rounds: 7)
        let sparse = FleetSimulation(devices: 20, seed: 3, rounds: 7, evaluateEvery: 3)
        let (_, all) = try await FleetHarness.run(every, workload: Self.workload(devices: 20), goal: 10)
        let (_, some) = try await FleetHarness.run(sparse, workload: Self.workload(devices: 20), goal: 10)
        #expect(some.filter { $0.testLoss != nil }.map(\.round) == [3, 6, 7])
        // Skipping evaluations changes nothing else: the evaluated rounds match the run that evaluates every round.
        for round in [3, 6, 7] { #expect(some[round - 1] == all[round - 1]) }
        let summary = SimulationSummary(settings: [:], initial: Evaluation(loss: 9), rounds: some, setupSeconds: 0)
        #expect(summary.final.loss == all[6].testLoss)
    }

    @Test func traceDrivesExpirationsResumptionsAndLateDevices() async throws {
        let trace = Availability.trace([
            AvailabilityWindow(device: 0, start: 0, end: .infinity),
            AvailabilityWindow(device: 1, start: 0, end: 10),
            AvailabilityWindow(device: 1, start: 50, end: .infinity),
            AvailabilityWindow(device: 2, start: 0, end: 12),
            AvailabilityWindow(device: 3, start: 0, end: 5),
        ])
        let conditions = FleetConditions(
            availability: trace, windowSeconds: 1000, resumeDelay: 0...0, checkInSpread: 0, medianSecondsPerUpdate: 1, speedSpread: 0
        )
        let fleet = FleetSimulation(devices: 5, conditions: conditions, seed: 5, rounds: 1)
        let (_, rounds) = try await FleetHarness.run(fleet, workload: Self.workload(devices: 5), goal: 3, overSelection: 1.3, cycleSeconds: 300)
        let r = try #require(rounds.first)
        // Device 4 has no window, and device 3's 5-second window is shorter than its scheduler's estimate of the task
        // (the policy's 10-second default), so the scheduler defers it: 3 check in. Device 0 finishes; 1 trains 9 of
        // its 20 updates, expires at 10 and resumes from its checkpoint at 50; 2 trains 11, expires at 12 for good.
        #expect(r.selected == 3)
        #expect(r.participants == 2)
        #expect(r.dropouts == 0)
        #expect(r.late == 1)
        #expect(r.expirations == 2)
        #expect(r.resumed == 1)
        #expect(r.aggregated)
        #expect(r.virtualEnd == 300)
    }

    @Test func everyDeviceDropsWithCertainDropout() async throws {
        let fleet = FleetSimulation(devices: 10, conditions: FleetConditions(dropout: 1), seed: 5, rounds: 2)
        let (_, rounds) = try await FleetHarness.run(fleet, workload: Self.workload(devices: 10), goal: 5, overSelection: 1.4)
        for r in rounds {
            #expect(r.selected == 7 && r.dropouts == 7 && r.participants == 0 && !r.aggregated)
        }
    }

    @Test func overSelectionLeavesLateDevices() async throws {
        let fleet = FleetSimulation(devices: 30, conditions: FleetConditions(), seed: 8, rounds: 3)
        let (_, rounds) = try await FleetHarness.run(fleet, workload: Self.workload(devices: 30), goal: 10, overSelection: 1.3)
        for r in rounds {
            #expect(r.selected == 13)
            #expect(r.participants == 10)
            #expect(r.late == 3)
            #expect(r.virtualEnd < r.virtualStart + 300)
        }
    }

    @Test func sameSeedSameMetricsWhateverTheParallelism() async throws {
        let conditions = FleetConditions(availability: .diurnal, dropout: 0.1, windowSeconds: 6)
        func run(parallelism: Int, seed: UInt64) async throws -> [RoundMetrics] {
            let fleet = FleetSimulation(devices: 40, conditions: conditions, seed: seed, rounds: 8, parallelism: parallelism)
            return try await FleetHarness.run(fleet, workload: Self.workload(devices: 40), goal: 8, overSelection: 1.375).rounds
        }
        let a = try await run(parallelism: 1, seed: 11), b = try await run(parallelism: 4, seed: 11)
        #expect(a == b)
        #expect(a.reduce(0) { $0 + $1.expirations } > 0)
        #expect(try await run(parallelism: 2, seed: 12) != a)
    }

    /// Cycles that fill (far more devices check in than the capacity): which devices are reached before the cycle is full
    /// does not depend on the cores, so neither do the rounds' counts or the model.
    @Test func roundsThatFillAreTheSameWhateverTheParallelism() async throws {
        let conditions = FleetConditions(dropout: 0.1, windowSeconds: 60, medianSecondsPerUpdate: 0.05)
        func run(parallelism: Int) async throws -> [RoundMetrics] {
            let fleet = FleetSimulation(devices: 80, conditions: conditions, seed: 21, rounds: 4, parallelism: parallelism)
            return try await FleetHarness.run(fleet, workload: Self.workload(devices: 80), goal: 5, overSelection: 1.4).rounds.map(\.withoutTiming)
        }
        let one = try await run(parallelism: 1), eight = try await run(parallelism: 8)
        #expect(one == eight)
        #expect(one.filter { $0.turnedAwayModeled > 0 }.count >= 2, "cycles filled: \(one.map { ($0.checkIns, $0.turnedAwayModeled, $0.participants) })")
    }

    /// A run ended by its virtual-time limit between evaluations still evaluates its last round, so the final accuracy
    /// is that round's and not an older one's or the initial model's.
    @Test func aRunEndedBetweenEvaluationsEvaluatesItsLastRound() async throws {
        let conditions = FleetConditions(dropout: 0, windowSeconds: 60, medianSecondsPerUpdate: 0.05)
        var fleet = FleetSimulation(devices: 40, conditions: conditions, seed: 21, rounds: 20, parallelism: 2, evaluateEvery: 10)
        fleet.virtualSecondsLimit = 6
        let rounds = try await FleetHarness.run(fleet, workload: Self.workload(devices: 40), goal: 5, overSelection: 1.4).rounds
        #expect(rounds.count >= 1 && rounds.count < 10, "\(rounds.count) rounds")
        #expect(rounds.last?.testAccuracy != nil, "the last round is evaluated")
        #expect(rounds.dropLast().allSatisfy { $0.testAccuracy == nil }, "the others are not (every 10th)")
    }

    @Test("devices reached once the cycle is full, modeled as turned away, change nothing but the work done")
    func modeledTurnedAwayMatchesTheFullStack() async throws {
        // Windows long enough for every task, so whether a device runs does not hang on its scheduler's history (which a
        // device never run does not gain), with dropouts and over-selection (late devices).
        let conditions = FleetConditions(dropout: 0.15, windowSeconds: 60, medianSecondsPerUpdate: 0.05)
        func run(_ choice: TurnedAwayChoice) async throws -> (rounds: [RoundMetrics], devices: Int) {
            let fleet = FleetSimulation(devices: 80, conditions: conditions, seed: 11, rounds: 6, parallelism: 2, turnedAway: choice)
            var devices = 0
            let (_, rounds) = try await FleetHarness.run(
                fleet, workload: Self.workload(devices: 80), goal: 5, overSelection: 1.4,
                devices: { directory in
                    devices = try FileManager.default.contentsOfDirectory(atPath: directory.path).count
                })
            return (rounds, devices)
        }
        let modeled = try await run(.modeled), full = try await run(.fullStack)
        func outcome(_ r: RoundMetrics) -> RoundMetrics {
            var copy = r.withoutTiming
            (copy.checkIns, copy.turnedAwayModeled) = (0, 0)
            return copy
        }
        #expect(modeled.rounds.map(outcome) == full.rounds.map(outcome))
        // Every device the modeled run did not start would have checked in and been turned away (the cycle closes before
        // some devices' windows open: those check in in neither run).
        for (m, f) in zip(modeled.rounds, full.rounds) {
            #expect(f.turnedAwayModeled == 0)
            #expect(m.checkIns + m.turnedAwayModeled == f.checkIns)
        }
        #expect(modeled.rounds.reduce(0) { $0 + $1.turnedAwayModeled } > 0)
        #expect(full.rounds.reduce(0) { $0 + $1.late + $1.dropouts } > 0)
        // The full stack runs a background task on every device (its job directory appears then); the modeled run only
        // on those the rounds reached.
        #expect(full.devices == 80)
        #expect(modeled.devices < full.devices)
    }

    @Test("a round's work grows with its participants, not with the population")
    func aLargePopulationSetsUpOnlyTheDevicesItsRoundsReach() async throws {
        let devices = 5000, goal = 3, rounds = 2, parallelism = 2
        // Every device is granted its window as the round opens (ties in device order), so the round reaches all of them.
        let fleet = FleetSimulation(devices: devices, conditions: FleetConditions(checkInSpread: 0), seed: 4, rounds: rounds, parallelism: parallelism)
        var started = 0
        let (_, records) = try await FleetHarness.run(
            fleet, workload: Self.workload(devices: devices), goal: goal,
            devices: { directory in
                started = try FileManager.default.contentsOfDirectory(atPath: directory.path).count
            })
        for r in records {
            #expect(r.aggregated && r.participants == goal)
            // Those not run were turned away without running. Run: at most the goal, the look-ahead and the one check-in
            // that found the cycle full.
            #expect(r.checkIns + r.turnedAwayModeled == devices)
            #expect(r.checkIns <= goal + 2 * parallelism + 1)
        }
        #expect(started <= rounds * (goal + 2 * parallelism + 1))
    }

    @Test func diurnalRoundsWaitForTheNight() async throws {
        let fleet = FleetSimulation(devices: 30, conditions: FleetConditions(availability: .diurnal), seed: 2, rounds: 2)
        let (_, rounds) = try await FleetHarness.run(fleet, workload: Self.workload(devices: 30), goal: 12, overSelection: 1.25)
        // At 18:00 (time 0) few phones charge; the first round opens once enough do.
        #expect(rounds[0].virtualStart > 0)
        #expect(rounds[0].availableFraction >= 12.0 / 30)
    }
}

@Suite struct ReportTests {
    func sampleRounds() -> [RoundMetrics] {
        (1...5).map { (r: Int) -> RoundMetrics in
            let x = Double(r)
            let accuracy: Double = 0.5 + x / 20
            return RoundMetrics(
                round: r, wallSeconds: 0.5, virtualStart: x * 100, virtualEnd: x * 100 + 90, availableFraction: 0.7,
                selected: 13, participants: 10, dropouts: r % 2, late: 3 - r % 2, expirations: r, resumed: r - 1, bytesUp: 1000,
                bytesDown: 1300, aggregated: true, testLoss: 1 / x, testAccuracy: accuracy, testRMSE: nil
            )
        }
    }

    @Test func writesWellFormedFiles() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-report-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let writer = try ReportWriter(directory: dir)
        let rounds = sampleRounds()
        for r in rounds { try writer.append(r) }
        let summary = SimulationSummary(settings: ["dataset": "fake <x>"], initial: Evaluation(loss: 2, accuracy: 0.1), rounds: rounds, setupSeconds: 1)
        try writer.finish(summary: summary, rounds: rounds, title: "Test run")

        #expect(try ReportWriter.readMetrics(writer.metricsURL) == rounds)
        let decoded = try JSONDecoder().decode(SimulationSummary.self, from: Data(contentsOf: writer.summaryURL))
        #expect(decoded == summary)
        #expect(decoded.dropouts == 3 && decoded.expirations == 15 && decoded.participants == 50)
        #expect(decoded.bestAccuracy == 0.75)
        // What a person or a pandas script reads uses snake_case keys.
        let firstLine = try #require(try String(contentsOf: writer.metricsURL, encoding: .utf8).split(separator: "\n").first)
        let record = try #require(try JSONSerialization.jsonObject(with: Data(firstLine.utf8)) as? [String: Any])
        #expect(
            Set(record.keys) == [
                "round", "wall_seconds", "virtual_start", "virtual_end", "available_fraction", "selected", "participants", "dropouts",
                "late", "expirations", "resumed", "bytes_up", "bytes_down", "aggregated", "test_loss", "test_accuracy", "check_ins",
                "turned_away_modeled",
            ])
        let summaryObject = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: writer.summaryURL)) as? [String: Any])
        for key in ["aggregated_rounds", "wall_seconds", "setup_seconds", "virtual_seconds", "bytes_up", "bytes_down", "best_accuracy", "final", "initial"] {
            #expect(summaryObject[key] != nil, "summary.json lacks \(key)")
        }
        #expect(summaryObject.keys.filter { $0.contains { $0.isUppercase } }.isEmpty)

        let html = try String(contentsOf: writer.reportURL, encoding: .utf8)
        #expect(html.hasPrefix("<!DOCTYPE html>"))
        // Accuracy (the headline, first), loss, accuracy over virtual time, participation, background windows, traffic (in
        // kB here) and availability, each drawn at a laptop's and at a phone's width.
        #expect(html.components(separatedBy: "<svg ").count - 1 == 14)
        #expect(html.components(separatedBy: "</svg>").count - 1 == 14)
        #expect(html.contains("Test accuracy over virtual time") && !html.contains("Staleness of the released reports"))
        #expect(html.components(separatedBy: "<figure").dropFirst().first?.contains("Test accuracy") == true)
        #expect(html.contains("bytes (kB)") && html.contains("5 kB / 6.5 kB"))
        #expect(html.contains("fake &lt;x&gt;"))
        #expect(!html.contains("<script"))
        #expect(!html.contains("http://") || html.components(separatedBy: "http://").dropFirst().allSatisfy { $0.hasPrefix("www.w3.org/2000/svg") })
        // The SVGs are well-formed XML.
        var rest = Substring(html)
        while let open = rest.range(of: "<svg "), let close = rest.range(of: "</svg>") {
            let svg = String(rest[open.lowerBound..<close.upperBound])
            #expect(throws: Never.self) { _ = try XMLDocument(xmlString: svg) }
            rest = rest[close.upperBound...]
        }
    }

    @Test func progressPrintsPlainLinesWithoutATerminal() {
        final class Sink: @unchecked Sendable { var text = "" }
        let sink = Sink()
        let display = ProgressDisplay(interactive: false) { sink.text += $0 }
        for r in sampleRounds() { display.update(r, total: 5) }
        let lines = sink.text.split(separator: "\n")
        #expect(lines.count == 5)
        #expect(lines[0].hasPrefix("round 1/5: acc 0.5500"))
        #expect(!sink.text.contains("\u{1B}"))
    }

    @Test func progressDrawsABarOnATerminal() {
        final class Sink: @unchecked Sendable { var text = "" }
        let sink = Sink()
        let display = ProgressDisplay(interactive: true) { sink.text += $0 }
        for r in sampleRounds() { display.update(r, total: 5) }
        #expect(sink.text.contains("\r\u{1B}[2K"))
        #expect(sink.text.contains(String(repeating: "█", count: 30)))
        #expect(sink.text.hasSuffix("\n"))
    }
}

@Suite struct FleetTrainingSettingsTests {
    @Test("devices train with the hosted process's client config, not the simulator's defaults")
    func devicesTrainWithWhatTheCoordinatorSends() async throws {
        let workload = FleetSimulationTests.workload(devices: 6)
        let fleet = FleetSimulation(devices: 6, conditions: FleetConditions(), seed: 5, rounds: 2)
        // The simulator's defaults would be 20 single-sample updates at 0.1; the process says otherwise.
        let sent = ClientConfig(batchSize: 3, learningRate: 0.25, localEpochs: 2, maxUpdates: 5)
        let (_, rounds) = try await FleetHarness.run(fleet, workload: workload, goal: 6, clientConfig: sent)
        #expect(rounds.allSatisfy { $0.aggregated })
        let seen = workload.seen.all
        #expect(seen == [SeenSettings.TrainingConfigurationKey(batchSize: 3, learningRate: 0.25, epochs: 2, maxUpdates: 5, loss: .meanSquaredError)])
    }

    @Test("fields the client config leaves out come from the architecture's training section")
    func unsetFieldsFallBackToTheArchitecture() async throws {
        let workload = FleetSimulationTests.workload(devices: 3)
        let fleet = FleetSimulation(devices: 3, conditions: FleetConditions(), seed: 5, rounds: 1)
        let (_, rounds) = try await FleetHarness.run(
            fleet, workload: workload, goal: 3, clientConfig: ClientConfig(learningRate: 0.5),
            architectureTraining: TrainingSpec(loss: .crossEntropy, optimizer: .sgd(learningRate: 0.01), epochs: 3, batchSize: 4, maxUpdates: 7))
        #expect(rounds.allSatisfy { $0.aggregated })
        #expect(workload.seen.all == [SeenSettings.TrainingConfigurationKey(batchSize: 4, learningRate: 0.5, epochs: 3, maxUpdates: 7, loss: .crossEntropy)])
    }
}

@Suite struct BufferedDownloadTests {
    @Test("a download buffer takes the bytes as they come whatever total length the coordinator announces")
    func announcedLengthDoesNotSizeTheBuffer() throws {
        let sink = BufferedDownload()
        // An external coordinator may announce any length: reserving it whole would abort the process.
        try sink.begin(DownloadHead(start: 0, totalLength: Int.max / 2, etag: nil))
        try sink.append([1, 2, 3])
        try sink.append([4])
        #expect(sink.contents.1 == [1, 2, 3, 4])
        #expect(sink.contents.0?.totalLength == Int.max / 2)
    }
}
