import Foundation
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import Testing
@testable import OrchardSimulation

/// End-to-end runs: central pretraining, the coordinator's cycle logic and aggregation, real local training with
/// checkpoint and resume, the report on disk.
@Suite(.serialized) struct SimulationRunnerTests {
    static func configuration(transport: TransportChoice, directory: URL, seed: UInt64 = 3) -> SimulationConfiguration {
        var c = SimulationConfiguration.housing
        c.clients = 10
        c.rounds = 6
        c.transport = transport
        c.seed = seed
        c.output = directory
        return c
    }

    static func temporaryDirectory() -> URL {
        FileManager.default.temporaryDirectory.appendingPathComponent("orchard-sim-test-\(UUID().uuidString)")
    }

    static let quiet = ProgressDisplay(interactive: false) { _ in }

    @Test func housingFleetImprovesTheModelAndWritesTheReport() async throws {
        let dir = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let result = try await SimulationRunner.run(Self.configuration(transport: .memory, directory: dir), progress: Self.quiet, clock: ManualClock())
        let summary = result.summary
        // The device model starts from freshly initialised dense layers on frozen embeddings: federated rounds
        // must bring its test RMSE (in $1000s) well below the initial one.
        let initial = try #require(summary.initial.rmse), final = try #require(summary.final.rmse)
        #expect(final < 0.6 * initial)
        #expect(final < 9)
        #expect(summary.aggregatedRounds >= 4)
        #expect(summary.expirations > 0 && summary.resumed > 0)
        // Wall seconds come from the injected real-time clock (here one that never moves), not from the
        // coordinator's clock, which follows virtual time.
        #expect(result.rounds.allSatisfy { $0.wallSeconds == 0 })
        #expect(try ReportWriter.readMetrics(dir.appendingPathComponent("metrics.jsonl")) == result.rounds)
        #expect(try JSONDecoder().decode(SimulationSummary.self, from: Data(contentsOf: dir.appendingPathComponent("summary.json"))) == summary)
        let html = try String(contentsOf: dir.appendingPathComponent("report.html"), encoding: .utf8)
        #expect(html.contains("<svg ") && html.contains("Test RMSE"))
    }

    /// A run that fails while its data is prepared (here: more devices than the housing rows) leaves an earlier run's
    /// files in its output directory as they were, and removes a directory it made itself.
    @Test func aRunThatFailsBeforeItBeginsLeavesTheOutputDirectoryAsItWas() async throws {
        let earlier = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: earlier) }
        try FileManager.default.createDirectory(at: earlier, withIntermediateDirectories: true)
        let metrics = earlier.appendingPathComponent("metrics.jsonl")
        try Data("{\"round\":1}\n".utf8).write(to: metrics)
        var c = Self.configuration(transport: .memory, directory: earlier)
        c.clients = 100_000
        await #expect(throws: SimulationError.self) { try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock()) }
        #expect(try String(contentsOf: metrics, encoding: .utf8) == "{\"round\":1}\n", "the earlier run's metrics were emptied")

        let fresh = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: fresh) }
        c.output = fresh
        await #expect(throws: SimulationError.self) { try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock()) }
        #expect(!FileManager.default.fileExists(atPath: fresh.path), "the directory the failed run made was left behind")
    }

    @Test func sameSeedGivesIdenticalMetricsInMemory() async throws {
        let a = Self.temporaryDirectory(), b = Self.temporaryDirectory()
        defer {
            try? FileManager.default.removeItem(at: a)
            try? FileManager.default.removeItem(at: b)
        }
        let first = try await SimulationRunner.run(Self.configuration(transport: .memory, directory: a), progress: Self.quiet, clock: ManualClock())
        let second = try await SimulationRunner.run(Self.configuration(transport: .memory, directory: b), progress: Self.quiet, clock: ManualClock())
        #expect(first.rounds.map(\.withoutTiming) == second.rounds.map(\.withoutTiming))
        #expect(first.rounds.map(\.testRMSE) == second.rounds.map(\.testRMSE))
    }

    /// `--transport http`: the real coordinator (HTTP server on a loopback port, SQLite store in a temporary
    /// directory) aggregates the fleet's reports, and the model improves as it does in memory.
    @Test func housingFleetOverLoopbackHTTPAggregatesThroughTheRealCoordinator() async throws {
        let dir = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let result = try await SimulationRunner.run(Self.configuration(transport: .http, directory: dir), progress: Self.quiet, clock: ManualClock())
        let summary = result.summary
        let initial = try #require(summary.initial.rmse), final = try #require(summary.final.rmse)
        #expect(final < 0.6 * initial)
        #expect(summary.aggregatedRounds >= 4)
        #expect(result.rounds.allSatisfy { $0.bytesUp > 0 || !$0.aggregated })
        #expect(summary.expirations > 0 && summary.resumed > 0)
    }

    /// `--dp-noise-multiplier`: the coordinator releases noised aggregates and the report says what they cost.
    @Test func aBufferedFleetReleasesFullBuffersWithStaleReportsAndStopsAtItsVirtualHours() async throws {
        let dir = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        var c = Self.configuration(transport: .memory, directory: dir)
        c.clients = 20
        c.rounds = 8
        c.buffered = BufferedAggregationConfig(bufferSize: 3, maxConcurrency: 8)
        let result = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        // A buffered round is a span of virtual time: a release does not end it, and it records how many it saw.
        let releases = result.rounds.filter(\.aggregated)
        #expect(releases.count >= 6)
        #expect(result.rounds.allSatisfy { $0.aggregated == (($0.releases ?? 0) > 0) })
        #expect(result.rounds.reduce(0) { $0 + ($1.releases ?? 0) } > result.rounds.count, "several releases a round")
        // A round's participants are the reports its releases aggregated: exactly buffer_size each, whenever they arrived.
        #expect(result.rounds.allSatisfy { $0.participants == 3 * ($0.releases ?? 0) }, "\(result.rounds.map { ($0.participants, $0.releases) })")
        // Every round records the devices training when it ended, never more than max_concurrency, and its releases the
        // mean staleness of their reports.
        #expect(result.rounds.allSatisfy { ($0.inFlight ?? 99) <= 8 })
        #expect(releases.allSatisfy { $0.staleness != nil })
        #expect(releases.contains { ($0.staleness ?? 0) > 0 }, "devices still training when a buffer is published report into the next")
        #expect(result.summary.settings["aggregation"] == "buffered" && result.summary.settings["buffer_size"] == "3")
        let html = try String(contentsOf: dir.appendingPathComponent("report.html"), encoding: .utf8)
        #expect(html.contains("Staleness of the released reports") && html.contains("Devices training when the round ended"))
        let final = try #require(result.summary.final.rmse), initial = try #require(result.summary.initial.rmse)
        #expect(final < initial)
        // With windows on the OS's schedule, a device checks in again at each of its windows in a round: a round's
        // releases take more reports than the fleet has devices, so some device reported twice in it.
        var granted = c
        granted.availability = .always
        granted.windowInterval = 60
        granted.rounds = 2
        let repeated = try await SimulationRunner.run(granted, progress: Self.quiet, clock: ManualClock())
        #expect(repeated.rounds.contains { ($0.releases ?? 0) * 3 > granted.clients }, "\(repeated.rounds.map(\.releases))")
        #expect(repeated.rounds.allSatisfy { $0.participants == 3 * ($0.releases ?? 0) }, "a device reporting twice counts twice")
        // The run ends after the round in progress once the virtual hours have passed.
        c.virtualHours = (result.rounds[1].virtualEnd + 1) / 3600
        let short = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        #expect(short.rounds.count == 3)
        // Ending at its virtual hours is how the run was asked to end, not an interruption (only Ctrl-C sets this).
        #expect(short.summary.plannedRounds == nil)
        // Out-of-range settings are refused before anything runs.
        for broken in [
            { (c: inout SimulationConfiguration) in c.windowInterval = 0 }, { $0.windowInterval = 90_000 }, { $0.virtualHours = -1 },
            { $0.virtualHours = .nan }, { $0.buffered?.bufferSize = 0 }, { $0.buffered?.maxConcurrency = 0 },
        ] {
            var bad = c
            bad.virtualHours = nil
            broken(&bad)
            #expect(throws: SimulationError.self) { try bad.validate() }
        }
        // Buffered aggregation refuses secure aggregation, with the reason.
        c.secureAggregation = SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 2))
        #expect(throws: SimulationError.self) { try c.validate() }
    }

    @Test func aPrivateFleetReportsTheEpsilonOfEveryRound() async throws {
        let dir = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        var c = Self.configuration(transport: .memory, directory: dir)
        c.privacy = PrivacyConfig(clippingNorm: 1, noiseMultiplier: 0.8, population: 1000)
        let result = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        var releases = 0
        for round in result.rounds {
            if round.aggregated { releases += 1 }
            // Every device a round admits counts: q = ⌈goal × over-selection⌉ / population.
            let capacity = (Double(c.goal) * c.overSelection).rounded(.up)
            let expected = try PrivacyAccountant.epsilon(samplingRate: capacity / 1000, noiseMultiplier: 0.8, steps: releases, delta: 1e-5).epsilon
            let epsilon = try #require(round.epsilon)
            #expect(abs(epsilon - expected) <= 1e-9 * max(expected, 1), "round \(round.round)")
        }
        #expect(releases >= 4)
        #expect(result.rounds.allSatisfy { $0.clippingNorm == 1 })
        #expect(result.summary.epsilon == result.rounds.last?.epsilon)
        #expect(result.summary.settings["dp_noise_multiplier"] == "0.8" && result.summary.settings["population"] == "1000")
        let html = try String(contentsOf: dir.appendingPathComponent("report.html"), encoding: .utf8)
        #expect(html.contains("privacy spent"))
        // The same seed gives the same noise: the run is reproducible.
        let again = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        #expect(again.rounds.map(\.testRMSE) == result.rounds.map(\.testRMSE))
        // Local mode noises on the devices: a different model from the central run with the same seed.
        c.privacy?.mode = .local
        let local = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        #expect(local.rounds.map(\.testRMSE) != result.rounds.map(\.testRMSE))
        #expect(local.rounds.allSatisfy { $0.epsilon != nil })
    }

    /// `--secure-aggregation`: every round's sum is unmasked by the coordinator, devices drop out at each stage (the
    /// fleet's dropout, drawn per stage), the counts say how many reached each one, and the run is reproducible.
    /// Twenty always-available devices, ten a round, 5 % dropout, secure aggregation with threshold 5 of 9 neighbours.
    static func secureFleet(directory: URL, consistencyCheck: Bool = false) -> SimulationConfiguration {
        var c = configuration(transport: .memory, directory: directory)
        c.clients = 20
        c.availability = .always
        c.windowSeconds = 120
        c.dropout = 0.05
        c.overSelection = 1
        c.secureAggregation = SecureAggregationConfig(
            parameters: SecureAggregationParameters(threshold: 5, consistencyCheck: consistencyCheck), stageTimeout: 10)
        return c
    }

    @Test func aSecureFleetAggregatesMaskedUpdatesDespiteDropoutsAtEachStage() async throws {
        let dir = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        var c = Self.secureFleet(directory: dir)
        let result = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        let initial = try #require(result.summary.initial.rmse), final = try #require(result.summary.final.rmse)
        #expect(final < 0.7 * initial)
        #expect(result.summary.aggregatedRounds >= 3)
        for round in result.rounds {
            let steps = try #require(round.secureAggregation)
            #expect(steps.advertised >= steps.shared && steps.shared >= steps.masked && steps.masked >= steps.unmasked, "round \(round.round): \(steps)")
            if round.aggregated { #expect(round.participants == steps.masked && steps.masked > c.secureAggregation!.parameters.threshold) }
        }
        let total = try #require(result.summary.secureAggregation)
        #expect(total.unmasked < total.advertised, "dropouts at some stage")
        #expect(result.summary.settings["secure_aggregation"] == "secagg")
        let html = try String(contentsOf: dir.appendingPathComponent("report.html"), encoding: .utf8)
        #expect(html.contains("Secure aggregation: devices per stage"))
        let again = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        #expect(again.rounds.map(\.withoutTiming) == result.rounds.map(\.withoutTiming))

        // Distributed differential privacy on top: the devices add the noise shares, the report carries ε.
        c.privacy = PrivacyConfig(mode: .distributed, clippingNorm: 1, noiseMultiplier: 0.5, population: 1000)
        let noised = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        #expect(noised.rounds.map(\.testRMSE) != result.rounds.map(\.testRMSE))
        let released = noised.rounds.filter(\.aggregated).count
        #expect(released >= 1)
        let expected = try PrivacyAccountant.epsilon(samplingRate: 10.0 / 1000, noiseMultiplier: 0.5, steps: released, delta: 1e-5).epsilon
        #expect(abs((noised.summary.epsilon ?? 0) - expected) <= 1e-9 * expected)
    }

    /// `--sa-consistency-check`: certified virtual devices sign their keys and the survivors; a fifth stage, with its
    /// own dropout and count, and the run still aggregates and is reproducible.
    @Test func aSignedSecureFleetChecksConsistencyEveryRound() async throws {
        let dir = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let c = Self.secureFleet(directory: dir, consistencyCheck: true)
        let result = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        #expect(result.summary.aggregatedRounds >= 3)
        let initial = try #require(result.summary.initial.rmse), final = try #require(result.summary.final.rmse)
        #expect(final < 0.7 * initial)
        for round in result.rounds {
            let steps = try #require(round.secureAggregation)
            let signed = try #require(steps.signed, "round \(round.round) counts signatures")
            #expect(steps.masked >= signed && signed >= steps.unmasked, "round \(round.round): \(steps)")
            if round.aggregated { #expect(signed > c.secureAggregation!.parameters.threshold) }
        }
        #expect(try #require(result.summary.secureAggregation?.signed) > 0)
        let again = try await SimulationRunner.run(c, progress: Self.quiet, clock: ManualClock())
        #expect(again.rounds.map(\.withoutTiming) == result.rounds.map(\.withoutTiming))
    }
}
