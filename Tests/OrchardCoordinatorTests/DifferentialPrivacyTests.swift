import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import Testing

/// A process of the fixture model with `server_config.privacy`.
func privateHostRequest(goal: Int = 2, minimum: Int? = nil, privacy: PrivacyConfig) -> HostProcessRequest {
    var request = Fixture.host(goal: goal, minimum: minimum ?? goal, overSelection: 1)
    request.serverConfig.privacy = privacy
    return request
}

/// DP-FedAvg on the coordinator, over loopback HTTP: clipping, equal weights, the fixed denominator, noise, the
/// ledger in the status and the checkpoint, the budget, adaptive clipping across a restart, and local mode.
@Suite(.serialized) struct DifferentialPrivacyTests {
    @Test func centralPrivacyClipsEachReportWeighsThemEquallyAndDividesByTheGoal() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            // z = 0.001 keeps the noise (σ/goal = 0.001 per value) far below the tolerance, so the arithmetic shows.
            let privacy = PrivacyConfig(clippingNorm: 2, noiseMultiplier: 0.001, delta: 1e-5, population: 1000)
            let hosted = try await harness.host(privateHostRequest(goal: 2, privacy: privacy))
            #expect(
                hosted.privacy
                    == PrivacyStatus(epsilon: 0, delta: 1e-5, releases: 0, samplingRate: 0.002, noiseMultiplier: 0.001, clippingNorm: 2, targetEpsilon: nil))
            let big = try await harness.device(), small = try await harness.device()
            let bigAssignment = try await harness.join(big), smallAssignment = try await harness.join(small)
            // √35 ≈ 5.92 > 2: clipped to 2; 0.1·√35 ≈ 0.59: kept. Sample counts (3 and 5,000) do not weigh.
            #expect(try await harness.report(big, bigAssignment, diff: Fixture.diff(1), samples: 3).status == 200)
            #expect(try await harness.report(small, smallAssignment, diff: Fixture.diff(0.1), samples: 5000).status == 200)
            let clipped = Float(2 / fixtureUnitNorm)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([((clipped + 0.1) / 2, 1)]), tolerance: 6e-3)

            let status = try await harness.status(hosted.processID)
            let expected = try PrivacyAccountant.epsilon(samplingRate: 0.002, noiseMultiplier: 0.001, steps: 1, delta: 1e-5).epsilon
            let spent = try #require(status.privacy)
            #expect(spent.releases == 1)
            #expect(abs(spent.epsilon - expected) <= 1e-9 * expected)
            // The checkpoint carries what it cost.
            let raw = try await harness.http.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: Harness.adminToken)
            let metadata = try Safetensors.decode(raw.body).metadata
            #expect(metadata["orchard.epsilon"].flatMap(Double.init) == spent.epsilon)
            #expect(metadata["orchard.delta"] == "1e-05")
            // And /metrics publishes it, per process.
            let metrics = String(decoding: try await harness.http.send("GET", Endpoint.metrics).body, as: UTF8.self)
            let lines = metrics.split(separator: "\n").filter { $0.hasPrefix("orchard_privacy_") && $0.contains(#"process="tiny""#) }
            #expect(lines.contains { $0.hasPrefix("orchard_privacy_releases{") && $0.hasSuffix(" 1.0") }, "\(metrics)")
            #expect(lines.contains { $0.hasPrefix("orchard_privacy_clipping_norm{") && $0.hasSuffix(" 2.0") }, "\(metrics)")
            let epsilonLine = try #require(lines.first { $0.hasPrefix("orchard_privacy_epsilon{") })
            let published = try #require(epsilonLine.split(separator: " ").last.flatMap { Double($0) })
            #expect(abs(published - spent.epsilon) <= 1e-6 * spent.epsilon, "\(epsilonLine)")
            // A restart goes on from the stored ledger: nothing spent is forgotten.
            try await harness.restart()
            #expect(try await harness.status(hosted.processID).privacy == spent)
        }
    }

    @Test func theProcessCompletesBeforeAReleaseWouldPassTheTargetEpsilon() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let q = 0.2, z = 1.0
            let first = try PrivacyAccountant.epsilon(samplingRate: q, noiseMultiplier: z, steps: 1, delta: 1e-5).epsilon
            let second = try PrivacyAccountant.epsilon(samplingRate: q, noiseMultiplier: z, steps: 2, delta: 1e-5).epsilon
            // A budget below one release is refused at hosting.
            let tooSmall = privateHostRequest(privacy: PrivacyConfig(clippingNorm: 1, noiseMultiplier: z, targetEpsilon: first / 2, population: 10))
            let refused = try await harness.http.json("POST", Endpoint.processes, tooSmall, token: Harness.adminToken)
            #expect(refused.status == 400)
            #expect(refused.errorCode == "invalid_configuration")
            #expect(try refused.decode(ErrorBody.self).error.message.contains("target_epsilon"))

            let budget = (first + second) / 2
            let hosted = try await harness.host(
                privateHostRequest(privacy: PrivacyConfig(clippingNorm: 1, noiseMultiplier: z, targetEpsilon: budget, population: 10)))
            let a = try await harness.device(), b = try await harness.device()
            let assignmentA = try await harness.join(a), assignmentB = try await harness.join(b)
            #expect(try await harness.report(a, assignmentA, diff: Fixture.diff(0.01), samples: 1).status == 200)
            #expect(try await harness.report(b, assignmentB, diff: Fixture.diff(0.01), samples: 1).status == 200)
            let status = try await harness.status(hosted.processID)
            #expect(status.state == .completed)
            #expect(status.currentCycle == nil)
            #expect(status.latestCheckpoint == 1)
            let spent = try #require(status.privacy)
            #expect(spent.releases == 1 && spent.epsilon <= budget && spent.targetEpsilon == budget)
            // No further cycle opens: a device is turned away.
            let c = try await harness.device()
            guard case .rejected = try await harness.requestCycle(c) else {
                Issue.record("a completed process admitted a device")
                return
            }
        }
    }

    @Test func adaptiveClippingCountsUnclippedReportsAcrossARestartAndMovesTheBound() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            // count_stddev 0.001 makes the released fraction 1 ± 0.0005, so the bound moves by exp(−0.2·(1 − 0.5)) ± 0.01 %.
            let privacy = PrivacyConfig(
                adaptiveClipping: .init(targetQuantile: 0.5, learningRate: 0.2, initialNorm: 1, countStandardDeviation: 0.001),
                noiseMultiplier: 0.001, population: 100
            )
            let hosted = try await harness.host(privateHostRequest(privacy: privacy))
            #expect(hosted.privacy?.clippingNorm == 1)
            let a = try await harness.device(), b = try await harness.device()
            let assignmentA = try await harness.join(a), assignmentB = try await harness.join(b)
            // Both within the bound (norms 0.59 and 0.30); the first one's count must survive the restart.
            #expect(try await harness.report(a, assignmentA, diff: Fixture.diff(0.1), samples: 1).status == 200)
            try await harness.restart()
            #expect(try await harness.report(b, assignmentB, diff: Fixture.diff(0.05), samples: 1).status == 200)
            let status = try await harness.status(hosted.processID)
            let bound = try #require(status.privacy?.clippingNorm)
            #expect(abs(bound - exp(-0.1)) < 2e-3, "\(bound)")
            // The next cycle clips to the moved bound: a report of norm 5.92 becomes one of norm exp(−0.1).
            let c = try await harness.device(), d = try await harness.device()
            let assignmentC = try await harness.join(c), assignmentD = try await harness.join(d)
            let before = try await harness.checkpoint(hosted.processID)
            #expect(try await harness.report(c, assignmentC, diff: Fixture.diff(1), samples: 1).status == 200)
            #expect(try await harness.report(d, assignmentD, diff: Fixture.diff(0), samples: 1).status == 200)
            let after = try await harness.checkpoint(hosted.processID)
            let scale = Float(bound / fixtureUnitNorm) / 2
            for (name, values) in after where !name.hasPrefix("embed.") {
                let start = try #require(before[name])
                for i in values.indices { #expect(abs(values[i] - start[i] - scale * Float(i + 1)) < 5e-3, "\(name)[\(i)]") }
            }
            // Clipped: the bound follows the fraction 0.5 now and stays put (±0.01 %).
            let next = try #require(try await harness.status(hosted.processID).privacy)
            #expect(abs(next.clippingNorm - bound) < 2e-3 * bound, "\(next.clippingNorm)")
            #expect(next.releases == 2)
        }
    }

    @Test func theFoldedCountOfUnclippedReportsSurvivesARestart() async throws {
        // Every report is folded into the stored running sum at once (fold interval 1), so the count that survives
        // the restart is the stored sum's, not the pending diffs'.
        let harness = try await Harness.start(configuration: CoordinatorConfiguration(adminToken: Harness.adminToken, foldInterval: 1))
        try await harness.stopping {
            let privacy = PrivacyConfig(
                adaptiveClipping: .init(targetQuantile: 0.5, learningRate: 0.2, initialNorm: 1, countStandardDeviation: 0.001),
                noiseMultiplier: 0.001, population: 100
            )
            let hosted = try await harness.host(privateHostRequest(goal: 3, privacy: privacy))
            var devices: [(AuthenticateResponse, CycleAssignment)] = []
            for _ in 0..<3 {
                let device = try await harness.device()
                devices.append((device, try await harness.join(device)))
            }
            #expect(try await harness.report(devices[0].0, devices[0].1, diff: Fixture.diff(0.1), samples: 1).status == 200)
            #expect(try await harness.report(devices[1].0, devices[1].1, diff: Fixture.diff(0.05), samples: 1).status == 200)
            try await harness.restart()
            #expect(try await harness.report(devices[2].0, devices[2].1, diff: Fixture.diff(1), samples: 1).status == 200)
            // Two of three within the bound: b̃ = (2 − 3/2)/3 + ½ = ⅔ (± 0.0003), C = exp(−0.2 · (⅔ − ½)); had the
            // folded count been lost, b̃ would be 0 and C = exp(0.1).
            let bound = try #require(try await harness.status(hosted.processID).privacy?.clippingNorm)
            #expect(abs(bound - exp(-0.2 / 6)) < 2e-3, "\(bound)")
        }
    }

    @Test func localPrivacyIsInThePlanTheCoordinatorDoesNotClipAndOldDevicesAreRefused() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let privacy = PrivacyConfig(mode: .local, clippingNorm: 1, noiseMultiplier: 0.5, population: 1000)
            let hosted = try await harness.host(privateHostRequest(goal: 2, minimum: 1, privacy: privacy))
            // The accountant charges the sum of minimum_reports noised reports: z·√1.
            #expect(hosted.privacy?.noiseMultiplier == 0.5)
            let old = AuthenticateRequest(processName: "tiny", processVersion: SemanticVersion(1, 0), protocolVersion: SemanticVersion(2, 1, 0))
            let refused = try await harness.http.json("POST", Endpoint.authenticate, old)
            #expect(refused.status == 400)
            #expect(refused.errorCode == "unsupported_version")
            #expect(try refused.decode(ErrorBody.self).error.message.contains("local differential privacy"))

            let device = try await harness.device()
            let assignment = try await harness.join(device)
            let plan = try await harness.http.send(
                "GET", Endpoint.plan(assignment.planID) + "?request_key=\(assignment.requestKey)", token: device.sessionToken
            ).decode(TrainingPlan.self)
            #expect(plan.localPrivacy == LocalPrivacy(clippingNorm: 1, noiseMultiplier: 0.5))
            // A report beyond what a clipped and noised one can reach, C·(1 + z(√6 + 6)) ≈ 5.22, is refused: one device
            // cannot move the model further than an honest one.
            let tooFar = try await harness.report(device, assignment, diff: Fixture.diff(1), samples: 7)
            #expect(tooFar.status == 422)
            #expect(tooFar.errorCode == "update_norm_exceeded")
            // A noised update is above the bound (norm 2.96 > 1); the coordinator must not shrink it (nor its noise).
            #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.5), samples: 7).status == 200)
            let other = try await harness.device()
            let otherAssignment = try await harness.join(other)
            #expect(try await harness.report(other, otherAssignment, diff: Fixture.diff(0), samples: 1).status == 200)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([(0.25, 1)]))
        }
    }

    @Test func unusablePrivacySettingsAreRefusedWhenHosted() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var both = privateHostRequest(privacy: PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, population: 100))
            both.serverConfig.updateNormBound = 3
            let cases: [(HostProcessRequest, String)] = [
                (both, "update_norm_bound"),
                (privateHostRequest(privacy: PrivacyConfig(noiseMultiplier: 1, population: 100)), "clipping_norm or adaptive_clipping"),
                (privateHostRequest(privacy: PrivacyConfig(clippingNorm: 1, adaptiveClipping: .init(), noiseMultiplier: 1, population: 100)), "not both"),
                (privateHostRequest(privacy: PrivacyConfig(mode: .local, adaptiveClipping: .init(), noiseMultiplier: 1, population: 100)), "mode central"),
                (privateHostRequest(goal: 3, privacy: PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, population: 2)), "population"),
                (privateHostRequest(privacy: PrivacyConfig(clippingNorm: 1, noiseMultiplier: 0, population: 100)), "noise_multiplier"),
                (privateHostRequest(privacy: PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, delta: 1, population: 100)), "delta"),
                (privateHostRequest(privacy: PrivacyConfig(clippingNorm: -1, noiseMultiplier: 1, population: 100)), "clipping_norm"),
                (
                    privateHostRequest(privacy: PrivacyConfig(adaptiveClipping: .init(countStandardDeviation: 0.1), noiseMultiplier: 1, population: 100)),
                    "count_stddev"
                ),
            ]
            for (request, fragment) in cases {
                let result = try await harness.http.json("POST", Endpoint.processes, request, token: Harness.adminToken)
                #expect(result.status == 400, "\(fragment)")
                #expect(result.errorCode == "invalid_configuration")
                let message = try result.decode(ErrorBody.self).error.message
                #expect(message.contains(fragment), "\(message)")
            }
            // An unknown key and a missing population are named.
            for (body, fragment) in [
                (#"{"noise_multiplier":1,"population":100,"clipping_norm":1,"clip":2}"#, "clip"),
                (#"{"noise_multiplier":1,"clipping_norm":1}"#, "population"),
                (#"{"noise_multiplier":1,"population":100,"clipping_norm":1,"mode":"distributed"}"#, "distributed"),
            ] {
                var json = try #require(try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(Fixture.host(goal: 2))) as? [String: Any])
                var server = try #require(json["server_config"] as? [String: Any])
                server["privacy"] = try JSONSerialization.jsonObject(with: Data(body.utf8))
                json["server_config"] = server
                let result = try await harness.http.send(
                    "POST", Endpoint.processes, body: Array(try JSONSerialization.data(withJSONObject: json)), token: Harness.adminToken)
                #expect(result.status == 400)
                #expect(try result.decode(ErrorBody.self).error.message.contains(fragment), "\(fragment)")
            }
            #expect(try await harness.http.send("GET", Endpoint.processes, token: Harness.adminToken).decode(ProcessList.self).processes.isEmpty)
        }
    }
}

/// The release arithmetic without I/O.
@Suite struct PrivacyMechanismTests {
    @Test func theReleasedMeanCarriesNoiseOfStandardDeviationZCOverTheGoal() throws {
        let server = ServerConfig(goalCount: 4, minimumReports: 4)
        let mechanism = PrivacyMechanism(config: PrivacyConfig(clippingNorm: 2, noiseMultiplier: 1, population: 1000), server: server)
        var generator = SplitMix64(seed: 7)
        let count = 40_000
        let released = try mechanism.release(
            sum: [Double](repeating: 8, count: count), reports: 4, unclipped: 0, ledger: mechanism.initialLedger, using: &generator)
        let mean = released.mean.reduce(0.0) { $0 + Double($1) } / Double(count)
        let variance = released.mean.reduce(0.0) { $0 + (Double($1) - mean) * (Double($1) - mean) } / Double(count - 1)
        // Mean 8/4 = 2; σ = z·C/goal = 0.5 (σ² = 0.25; the sample variance's relative error is ~√(2/n) = 0.7 %).
        #expect(abs(mean - 2) < 0.01)
        #expect(abs(variance - 0.25) < 0.25 * 0.03, "\(variance)")
        #expect(released.ledger.releases == 1)
        #expect(released.ledger.epsilon == (try mechanism.epsilon(releases: 1)))
        #expect(released.ledger.clippingNorm == 2)
    }

    @Test func adaptiveClippingTakesAShareOfTheNoiseAndFollowsTheQuantile() throws {
        let server = ServerConfig(goalCount: 100, minimumReports: 50)
        let config = PrivacyConfig(adaptiveClipping: .init(targetQuantile: 0.5, learningRate: 0.2, initialNorm: 1), noiseMultiplier: 1, population: 10_000)
        let mechanism = PrivacyMechanism(config: config, server: server)
        // σ_b = max(100/20, 1) = 5: z_Δ = (1 − 1/100)^(−1/2).
        #expect(abs(mechanism.updateNoiseMultiplier - 1 / (1 - 0.01).squareRoot()) < 1e-12)
        var generator = SplitMix64(seed: 3)
        var ledger = mechanism.initialLedger
        // Every report unclipped → the bound shrinks; none → it grows.
        ledger = try mechanism.release(sum: [0], reports: 100, unclipped: 100, ledger: ledger, using: &generator).ledger
        #expect(ledger.clippingNorm < 0.93 && ledger.clippingNorm > 0.88)
        var grown = mechanism.initialLedger
        grown = try mechanism.release(sum: [0], reports: 100, unclipped: 0, ledger: grown, using: &generator).ledger
        #expect(grown.clippingNorm > 1.07 && grown.clippingNorm < 1.13)
    }

    @Test func theBudgetAllowsAReleaseOnlyWhileItStaysWithinTheTarget() throws {
        let server = ServerConfig(goalCount: 10, overSelection: 1, minimumReports: 10)
        let first = try PrivacyAccountant.epsilon(samplingRate: 0.01, noiseMultiplier: 1, steps: 1, delta: 1e-5).epsilon
        let mechanism = PrivacyMechanism(config: PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, targetEpsilon: first, population: 1000), server: server)
        #expect(try mechanism.allowsRelease(after: mechanism.initialLedger))
        #expect(try !mechanism.allowsRelease(after: PrivacyLedger(releases: 1, epsilon: first, clippingNorm: 1)))
        let unbounded = PrivacyMechanism(config: PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, population: 1000), server: server)
        #expect(try unbounded.allowsRelease(after: PrivacyLedger(releases: 1_000_000, epsilon: 1e9, clippingNorm: 1)))
        // Local mode charges the sum of minimum_reports noised reports.
        let local = PrivacyMechanism(config: PrivacyConfig(mode: .local, clippingNorm: 1, noiseMultiplier: 0.5, population: 1000), server: server)
        #expect(abs(local.accountedNoiseMultiplier - 0.5 * 10.0.squareRoot()) < 1e-12)
        #expect(local.serverClippingNorm(local.initialLedger) == nil)
    }

    @Test func theReleasedFractionIsCentredAndItsNoiseMatchesTheSensitivityOfOneHalf() throws {
        // σ_b = 5 on the centred count Σ(bᵢ − ½): b̃ = (Σ(bᵢ − ½) + N(0, 25))/100 + ½. With 60 of 100 unclipped,
        // b̃ has mean 0.6 and standard deviation 0.05; the bound moves by exp(−η(b̃ − γ)).
        let server = ServerConfig(goalCount: 100, minimumReports: 50)
        let config = PrivacyConfig(
            adaptiveClipping: .init(targetQuantile: 0.5, learningRate: 1, initialNorm: 1, countStandardDeviation: 5), noiseMultiplier: 1, population: 10_000)
        let mechanism = PrivacyMechanism(config: config, server: server)
        var generator = SplitMix64(seed: 11)
        let fractions = try (0..<4000).map { _ in
            let next = try mechanism.release(sum: [0], reports: 100, unclipped: 60, ledger: mechanism.initialLedger, using: &generator).ledger
            return 0.5 - log(next.clippingNorm)  // η = 1, γ = 0.5: log C' = −(b̃ − 0.5)
        }
        let mean = fractions.reduce(0, +) / Double(fractions.count)
        let variance = fractions.reduce(0) { $0 + ($1 - mean) * ($1 - mean) } / Double(fractions.count - 1)
        #expect(abs(mean - 0.6) < 0.003, "\(mean)")
        #expect(abs(variance.squareRoot() - 0.05) < 0.003, "\(variance.squareRoot())")
        // The two releases together cost what z alone would: z_Δ⁻² + (2σ_b)⁻² = z⁻².
        let combined = 1 / (mechanism.updateNoiseMultiplier * mechanism.updateNoiseMultiplier) + 1 / (4 * 5.0 * 5.0)
        #expect(abs(combined - 1) < 1e-12)
    }

    @Test func theSamplingRateCountsEveryDeviceACycleAdmits() {
        // Over-selection admits ⌈10 × 1.3⌉ = 13 devices, all of whose reports may be summed.
        let server = ServerConfig(goalCount: 10, overSelection: 1.3, minimumReports: 5)
        let mechanism = PrivacyMechanism(config: PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, population: 1000), server: server)
        #expect(mechanism.samplingRate == 0.013)
        #expect(PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, population: 12).validationFailure(goalCount: 10, capacity: 13)?.contains("(13)") == true)
        // δ at or above 1/population is allowed (the papers' δ = 10⁻⁵ at 10⁶ devices) but cautioned against.
        let loose = PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, delta: 1e-3, population: 1000)
        #expect(loose.validationFailure(goalCount: 10) == nil)
        #expect(loose.deltaCaution?.contains("1/population") == true)
        #expect(PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, delta: 9e-4, population: 1000).deltaCaution == nil)
    }

    @Test func localModeBoundsAReportByWhatAnHonestNoisedOneCanReach() {
        let server = ServerConfig(goalCount: 10, minimumReports: 10)
        let local = PrivacyMechanism(config: PrivacyConfig(mode: .local, clippingNorm: 2, noiseMultiplier: 0.5, population: 1000), server: server)
        let expected: Double = 2 * (1 + 0.5 * 106)
        #expect(local.localNormCeiling(dimension: 10_000) == expected)
        let central = PrivacyMechanism(config: PrivacyConfig(clippingNorm: 2, noiseMultiplier: 0.5, population: 1000), server: server)
        #expect(central.localNormCeiling(dimension: 10_000) == nil)
        // An honest report: clipped, then noised, stays below it.
        var generator = SplitMix64(seed: 5)
        var values = [Float](repeating: 1, count: 10_000)
        Clipping.clip(&values, to: 2)
        GaussianNoise.add(to: &values, standardDeviation: 1, using: &generator)
        let norm = values.reduce(0.0) { $0 + Double($1) * Double($1) }.squareRoot()
        #expect(norm < local.localNormCeiling(dimension: 10_000)!)
    }
}
