import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import Testing

private let t0 = Date(timeIntervalSince1970: 2_000_000)

/// A buffered state machine: buffers of `size`, at most `concurrency` devices training, `window` seconds to report.
private func bufferedMachine(size: Int = 2, concurrency: Int = 3, window: Double = 100) -> CycleStateMachine {
    var server = ServerConfig(cycleLength: window, paceSteeringWindow: 10)
    server.aggregationMode = .buffered
    server.buffered = BufferedAggregationConfig(bufferSize: size, maxConcurrency: concurrency)
    return CycleStateMachine(configuration: .init(server), openedAt: t0)
}

extension CycleStateMachine {
    fileprivate mutating func join(_ worker: String, at time: Date = t0) -> Bool {
        if case .assigned = requestCycle(workerID: worker, now: time, newRequestKey: "key-\(worker)", jitter: 0) { return true }
        return false
    }

    fileprivate mutating func send(_ worker: String, at time: Date = t0) -> (decision: ReportDecision, action: CycleAction?) {
        let decision = beginReport(workerID: worker, requestKey: "key-\(worker)", now: time)
        guard case .proceed = decision else { return (decision, nil) }
        return (decision, commitReport(workerID: worker))
    }

    /// Plans and applies the transition an action calls for, at `time`.
    fileprivate mutating func release(_ action: CycleAction?, at time: Date = t0) {
        guard let action else {
            Issue.record("no release")
            return
        }
        apply(plan(action, now: time))
    }
}

/// Buffered asynchronous aggregation (FedBuff): the state machine, the staleness weights, the configuration's rules, and
/// a coordinator on loopback HTTP with a real SQLite file.
@Suite struct BufferedStateMachineTests {
    @Test func stalenessWeightsMatchAHandComputation() {
        let fedBuff = BufferedAggregationConfig()
        #expect(fedBuff.stalenessWeight(0) == 1)
        #expect(fedBuff.stalenessWeight(3) == 0.5)  // 1/√4
        #expect(abs(fedBuff.stalenessWeight(1) - 0.707_106_781_186_547_5) < 1e-15)
        let linear = BufferedAggregationConfig(stalenessExponent: 1)
        #expect(linear.stalenessWeight(4) == 0.2)
        let constant = BufferedAggregationConfig(stalenessExponent: 0)
        #expect(constant.stalenessWeight(50) == 1)
    }

    @Test func admitsWhileFewerThanMaxConcurrencyTrainAndAReportFreesAPlace() {
        var m = bufferedMachine(size: 5, concurrency: 2)
        let check1 = m.join("a") && m.join("b")
        #expect(check1)
        let check2 = m.requestCycle(workerID: "c", now: t0, newRequestKey: "key-c", jitter: 0) == .rejected(retryAfter: 5, reason: "cycle_full")
        #expect(check2)
        #expect(m.inFlight == 2)
        let check3 = m.send("a").action == nil
        #expect(check3)
        // a reported: a place is free, and a cannot train again for this buffer.
        #expect(m.inFlight == 1)
        let check4 = m.join("c")
        #expect(check4)
        guard case .rejected(_, "already_reported") = m.requestCycle(workerID: "a", now: t0, newRequestKey: "x", jitter: 0) else {
            Issue.record("a reporter was admitted twice to one buffer")
            return
        }
    }

    @Test func aFullBufferIsReleasedAndTheDevicesStillTrainingCarryOverWithTheirKeys() {
        var m = bufferedMachine(size: 2, concurrency: 3)
        let check5 = m.join("a") && m.join("b") && m.join("c")
        #expect(check5)
        let check6 = m.send("a").action == nil
        #expect(check6)
        let (decision, action) = m.send("b")
        #expect(decision == .proceed(cycle: 1))
        #expect(action == .aggregate(cycle: 1, reports: 2))
        // While the buffer is being published a report is asked to come again, not refused.
        guard case .retry = m.beginReport(workerID: "c", requestKey: "key-c", now: t0) else {
            Issue.record("a report during the release was not asked to retry")
            return
        }
        m.release(action, at: t0.addingTimeInterval(5))
        #expect(m.cycle == 2 && m.checkpoint == 1 && m.reported == 0)
        // c trained from checkpoint 0 and reports into buffer 2 with the key it was given in buffer 1.
        #expect(m.assignments.keys.sorted() == ["c"])
        #expect(m.inFlight == 1)
        #expect(m.owner(ofRequestKey: "key-c") == "c")
        let check7 = m.send("c", at: t0.addingTimeInterval(6)).decision == .proceed(cycle: 2)
        #expect(check7)
        // The reporters of buffer 1 may train again.
        let check8 = m.join("a", at: t0.addingTimeInterval(6))
        #expect(check8)
        // A key of a reporter of the closed buffer is refused as belonging to it.
        guard case .refused(.deadlinePassed, _) = m.beginReport(workerID: "b", requestKey: "key-b", now: t0.addingTimeInterval(6)) else {
            Issue.record("a closed buffer's key was accepted")
            return
        }
    }

    @Test func anAssignmentExpiresAfterCycleLengthFreesItsPlaceAndIsNotCarriedOver() {
        var m = bufferedMachine(size: 2, concurrency: 2, window: 100)
        let check9 = m.join("a") && m.join("b", at: t0.addingTimeInterval(50))
        #expect(check9)
        // At 100 s a's time is up: its place goes to c, and its report is refused.
        let check10 = m.join("c", at: t0.addingTimeInterval(100))
        #expect(check10)
        let late = m.beginReport(workerID: "a", requestKey: "key-a", now: t0.addingTimeInterval(101))
        guard case .refused(.deadlinePassed, _) = late else {
            Issue.record("an expired assignment's report was accepted: \(late)")
            return
        }
        let check11 = m.requestCycle(workerID: "a", now: t0.addingTimeInterval(101), newRequestKey: "x", jitter: 0).isRejected(reason: "assignment_expired")
        #expect(check11)
        let check12 = m.send("c", at: t0.addingTimeInterval(120)).action == nil
        #expect(check12)
        // b expires at 150; the timer frees its place.
        _ = m.timerFired(now: t0.addingTimeInterval(150))
        #expect(m.inFlight == 0)
        let check13 = m.join("d", at: t0.addingTimeInterval(151)) && m.join("e", at: t0.addingTimeInterval(151))
        #expect(check13)
        let action = m.send("d", at: t0.addingTimeInterval(160)).action
        // Released at 260: e (admitted at 151) expires at 251 and is not carried over.
        m.release(action, at: t0.addingTimeInterval(260))
        #expect(m.assignments.isEmpty && m.inFlight == 0)
    }

    @Test func aBufferHasNoDeadlineAndNeverClosesOnTheTimer() {
        var m = bufferedMachine(size: 3, concurrency: 3, window: 100)
        let check14 = m.join("a")
        #expect(check14)
        let check15 = m.send("a").action == nil
        #expect(check15)
        let check16 = m.timerFired(now: t0.addingTimeInterval(86_400 * 30)) == nil
        #expect(check16)
        #expect(m.phase == .open && m.reported == 1)
    }

    @Test func synchronizingAssignmentsRecordedElsewhereCountsThemInFlight() {
        var m = bufferedMachine(size: 3, concurrency: 2)
        let check17 = m.join("a")
        #expect(check17)
        _ = m.synchronize(with: [CycleStateMachine.Assignment(workerID: "z", requestKey: "key-z", assignedAt: t0)])
        #expect(m.inFlight == 2)
        _ = m.synchronize(with: [CycleStateMachine.Assignment(workerID: "z", requestKey: "key-z", state: .reported, assignedAt: t0)])
        #expect(m.inFlight == 1 && m.reported == 1)
    }

    /// An assignment expired on this instance's clock whose report another instance committed (it began in time and
    /// finished within the grace) counts as reported once synchronized, so the two views agree and the instance stops
    /// re-reading the store on every tick; it was out of flight already.
    @Test func anAssignmentExpiredHereButReportedElsewhereCountsAsReported() {
        var m = bufferedMachine(size: 3, concurrency: 3, window: 100)
        #expect(m.join("a") && m.join("b"))
        _ = m.timerFired(now: t0.addingTimeInterval(101))
        #expect(m.inFlight == 0 && m.reported == 0)
        _ = m.synchronize(with: [CycleStateMachine.Assignment(workerID: "a", requestKey: "key-a", state: .reported, assignedAt: t0)])
        #expect(m.reported == 1 && m.inFlight == 0)
        // Synchronizing the same again changes nothing.
        _ = m.synchronize(with: [CycleStateMachine.Assignment(workerID: "a", requestKey: "key-a", state: .reported, assignedAt: t0)])
        #expect(m.reported == 1 && m.inFlight == 0)
    }
}

extension CycleStateMachine.CycleDecision {
    fileprivate func isRejected(reason expected: String) -> Bool {
        if case .rejected(_, let reason) = self { return reason == expected }
        return false
    }
}

@Suite struct BufferedConfigurationTests {
    static func buffered(_ config: BufferedAggregationConfig = BufferedAggregationConfig()) -> ServerConfig {
        var server = ServerConfig()
        server.aggregationMode = .buffered
        server.buffered = config
        return server
    }

    @Test func theWireNamesAndDefaults() throws {
        let json = #"{"aggregation_mode": "buffered", "buffered": {"buffer_size": 50, "max_concurrency": 200}}"#
        let server = try WireCoding.strictDecoder().decode(ServerConfig.self, from: Data(json.utf8))
        #expect(server.bufferedAggregation == BufferedAggregationConfig(bufferSize: 50, maxConcurrency: 200, stalenessExponent: 0.5, maxStaleness: 20))
        #expect(server.validationFailure() == nil)
        // The mode alone takes the defaults.
        let defaults = try WireCoding.strictDecoder().decode(ServerConfig.self, from: Data(#"{"aggregation_mode": "buffered"}"#.utf8))
        #expect(defaults.bufferedAggregation == BufferedAggregationConfig())
        #expect(try WireCoding.strictDecoder().decode(ServerConfig.self, from: Data("{}".utf8)).bufferedAggregation == nil)
        // Unknown modes and keys are refused.
        #expect(throws: DecodingError.self) { try WireCoding.strictDecoder().decode(ServerConfig.self, from: Data(#"{"aggregation_mode": "async"}"#.utf8)) }
        #expect(throws: DecodingError.self) {
            try WireCoding.strictDecoder().decode(ServerConfig.self, from: Data(#"{"aggregation_mode": "buffered", "buffered": {"k": 3}}"#.utf8))
        }
        let encoded = String(decoding: try WireCoding.encoder().encode(server), as: UTF8.self)
        #expect(encoded.contains(#""aggregation_mode":"buffered""#) && encoded.contains(#""buffer_size":50"#))
    }

    @Test func invalidSettingsAreRefusedWithTheReason() {
        let cases: [(ServerConfig, String)] = [
            (Self.buffered(BufferedAggregationConfig(bufferSize: 0)), "buffer_size must be in"),
            (Self.buffered(BufferedAggregationConfig(maxConcurrency: 0)), "max_concurrency must be in"),
            (Self.buffered(BufferedAggregationConfig(stalenessExponent: -1)), "staleness_exponent must be in"),
            (Self.buffered(BufferedAggregationConfig(stalenessExponent: .nan)), "staleness_exponent must be in"),
            (Self.buffered(BufferedAggregationConfig(maxStaleness: -1)), "max_staleness must be"),
            (
                {
                    var s = ServerConfig(); s.buffered = BufferedAggregationConfig(); return s
                }(), "needs server_config.aggregation_mode"
            ),
            (
                {
                    var s = Self.buffered(); s.secureAggregation = SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 2));
                    s.minimumReports = 3; return s
                }(),
                "cannot be used with server_config.secure_aggregation: masking needs its cohort fixed"
            ),
            (
                {
                    var s = Self.buffered(); s.robustAggregation = .median; return s
                }(),
                "cannot be used with server_config.robust_aggregation"
            ),
        ]
        for (config, expected) in cases {
            let failure = config.validationFailure() ?? ""
            #expect(failure.contains(expected), "\(failure)")
        }
    }

    @Test func privacyCountsReleasesOfBufferSize() {
        var server = Self.buffered(BufferedAggregationConfig(bufferSize: 8, maxConcurrency: 100))
        server.goalCount = 100
        server.privacy = PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, population: 1000)
        #expect(server.validationFailure() == nil)
        let mechanism = PrivacyMechanism(config: server.privacy!, server: server)
        #expect(mechanism.goalCount == 8)
        #expect(mechanism.samplingRate == 0.008)
    }
}

/// A buffered process on a coordinator on loopback HTTP with a real SQLite file.
@Suite(.serialized) struct BufferedCoordinatorTests {
    static func host(size: Int = 2, concurrency: Int = 3, maxStaleness: Int = 20, window: Double = 600) -> HostProcessRequest {
        var request = Fixture.host(cycleLength: window)
        request.serverConfig.aggregationMode = .buffered
        request.serverConfig.buffered = BufferedAggregationConfig(bufferSize: size, maxConcurrency: concurrency, maxStaleness: maxStaleness)
        return request
    }

    /// `base + Σ nᵢ wᵢ dᵢ / Σ nᵢ` for the trainable tensors (wᵢ the staleness weight), in Double.
    static func expectedRelease(from base: [String: [Float]], _ reports: [(scale: Float, samples: Int, staleness: Int)]) -> [String: [Float]] {
        let config = BufferedAggregationConfig()
        let total = Double(reports.reduce(0) { $0 + $1.samples })
        var out: [String: [Float]] = [:]
        for tensor in Fixture.weights {
            let frozen = tensor.name.hasPrefix("embed.")
            out[tensor.name] = tensor.values.indices.map { i in
                let current = base[tensor.name]![i]
                if frozen { return current }
                let step =
                    reports.reduce(0.0) { $0 + Double($1.samples) * config.stalenessWeight($1.staleness) * Double($1.scale) * Double(i + 1) } / total
                return Float(Double(current) + step)
            }
        }
        return out
    }

    @Test func aReleaseIsTheStalenessWeightedFoldOfExactlyTheAcknowledgedReports() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(size: 2, concurrency: 3))
            #expect(hosted.serverConfig.bufferedAggregation?.bufferSize == 2)
            let a = try await harness.device(), b = try await harness.device(), c = try await harness.device(), d = try await harness.device()
            let ja = try await harness.join(a), jb = try await harness.join(b), jc = try await harness.join(c)
            #expect([ja, jb, jc].allSatisfy { $0.checkpoint == 0 })
            // Three devices training: a fourth is turned away until one reports.
            guard case .rejected(let rejection) = try await harness.requestCycle(d) else {
                Issue.record("a fourth device was admitted past max_concurrency")
                return
            }
            #expect(rejection.reason == "cycle_full")
            #expect(try await harness.report(a, ja, diff: Fixture.diff(0.1), samples: 3, checkpoint: 0).status == 200)
            var status = try await harness.status(hosted.processID)
            #expect(
                status.currentCycle?.buffered
                    == BufferedStatus(bufferSize: 2, bufferFill: 1, inFlight: 2, maxConcurrency: 3, releases: 0, meanStaleness: 0, maxStaleness: 0))
            let jd = try await harness.join(d)
            // b fills the buffer: checkpoint 1 is published.
            let second = try await harness.report(b, jb, diff: Fixture.diff(-0.3), samples: 1, checkpoint: 0)
            #expect(second.status == 200)
            #expect(try second.decode(ReportResponse.self).cycleClosed == true)
            let first = Self.expectedRelease(from: Fixture.host().weightsByName, [(0.1, 3, 0), (-0.3, 1, 0)])
            expectClose(try await harness.checkpoint(hosted.processID), first)
            // c and d trained from checkpoint 0 and report into buffer 2 with staleness 1; the release is their
            // staleness-weighted fold.
            #expect(try await harness.report(c, jc, diff: Fixture.diff(0.2), samples: 7, checkpoint: 0).status == 200)
            status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.number == 2 && status.currentCycle?.buffered?.meanStaleness == 1)
            #expect(try await harness.report(d, jd, diff: Fixture.diff(0.5), samples: 2, checkpoint: 0).status == 200)
            expectClose(try await harness.checkpoint(hosted.processID), Self.expectedRelease(from: first, [(0.2, 7, 1), (0.5, 2, 1)]))
            status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 2 && status.cyclesCompleted == 2 && status.currentCycle?.buffered?.inFlight == 0)
            // The history carries each release's mean staleness.
            let history = try await harness.http.send("GET", Endpoint.cycles(hosted.processID), token: Harness.adminToken)
            let records = try history.decode(ProcessCycles.self).cycles
            #expect(records.map { $0.metrics["staleness"] } == [0, 1])
        }
    }

    @Test func underCentralPrivacyEachReleaseIsNoisedAndCountedByTheAccountant() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Self.host(size: 2, concurrency: 4)
            request.serverConfig.privacy = PrivacyConfig(clippingNorm: 1, noiseMultiplier: 1, population: 1000)
            let hosted = try await harness.host(request)
            #expect(hosted.privacy?.samplingRate == 0.002, "a release takes buffer_size of the population")
            var epsilons: [Double] = []
            for release in 0..<2 {
                let devices = [try await harness.device(), try await harness.device()]
                for device in devices {
                    let assignment = try await harness.join(device)
                    #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.1), samples: 3, checkpoint: release).status == 200)
                }
                let status = try await harness.status(hosted.processID)
                #expect(status.latestCheckpoint == release + 1)
                #expect(status.privacy?.releases == release + 1)
                epsilons.append(status.privacy?.epsilon ?? 0)
            }
            #expect(epsilons[0] > 0 && epsilons[1] > epsilons[0])
        }
    }

    @Test func badReportsAreRefusedWithTheirCodes() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host(Self.host(size: 1, concurrency: 4, maxStaleness: 0))
            let a = try await harness.device(), b = try await harness.device()
            let ja = try await harness.join(a), jb = try await harness.join(b)
            // No checkpoint, or one not yet published: invalid_request, and the device may send it again.
            let missing = try await harness.report(a, ja, diff: Fixture.diff(0.1), samples: 1)
            #expect(missing.status == 400 && missing.errorCode == "invalid_request")
            let future = try await harness.report(a, ja, diff: Fixture.diff(0.1), samples: 1, checkpoint: 1)
            #expect(future.status == 400 && future.errorCode == "invalid_request")
            for forged in [-1, Int.min, Int.max] {
                let bad = try await harness.report(a, ja, diff: Fixture.diff(0.1), samples: 1, checkpoint: forged)
                #expect(bad.status == 400 && bad.errorCode == "invalid_request", "checkpoint \(forged)")
            }
            #expect(try await harness.report(a, ja, diff: Fixture.diff(0.1), samples: 1, checkpoint: 0).status == 200)
            // b trained from checkpoint 0, one release ago, past max_staleness 0.
            let stale = try await harness.report(b, jb, diff: Fixture.diff(0.1), samples: 1, checkpoint: 0)
            #expect(stale.status == 409 && stale.errorCode == "report_too_stale")
            // b keeps its assignment: asking again, it is told the latest checkpoint, and its retrained report counts.
            let again = try await harness.join(b)
            #expect(again.requestKey == jb.requestKey && again.checkpoint == 1)
            #expect(try await harness.report(b, again, diff: Fixture.diff(0.1), samples: 1, checkpoint: 1).status == 200)
            // A device of protocol 2.5 cannot say which checkpoint it trained from: refused at authentication.
            let old = AuthenticateRequest(processName: "tiny", processVersion: SemanticVersion(1, 0), protocolVersion: SemanticVersion(2, 5, 0))
            let refused = try await harness.http.json("POST", Endpoint.authenticate, old)
            #expect(refused.status == 400 && refused.errorCode == "unsupported_version")
        }
    }

    /// The update norm bound clips a report before its staleness weight and the fold, as in a cycle.
    @Test func theNormBoundClipsReportsBeforeTheirStalenessWeight() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Self.host(size: 2, concurrency: 3)
            request.serverConfig.updateNormBound = 2
            let clipped = try await harness.host(request)
            let a = try await harness.device(), b = try await harness.device(), c = try await harness.device()
            let ja = try await harness.join(a), jb = try await harness.join(b), jc = try await harness.join(c)
            // Norm √35 ≈ 5.92 > 2: clipped to 2 before it is folded. Norm 0.1 √35 ≈ 0.59: kept.
            #expect(try await harness.report(a, ja, diff: Fixture.diff(1), samples: 3, checkpoint: 0).status == 200)
            #expect(try await harness.report(b, jb, diff: Fixture.diff(0.1), samples: 5, checkpoint: 0).status == 200)
            let clippedScale = Float(2 / fixtureUnitNorm)
            let first = Self.expectedRelease(from: Fixture.host().weightsByName, [(clippedScale, 3, 0), (0.1, 5, 0)])
            expectClose(try await harness.checkpoint(clipped.processID), first, tolerance: 1e-6)
            // c trained from checkpoint 0: clipped, then weighed for staleness 1.
            #expect(try await harness.report(c, jc, diff: Fixture.diff(-1), samples: 2, checkpoint: 0).status == 200)
            let d = try await harness.device()
            let jd = try await harness.join(d)
            #expect(try await harness.report(d, jd, diff: Fixture.diff(0.1), samples: 1, checkpoint: 1).status == 200)
            expectClose(
                try await harness.checkpoint(clipped.processID), Self.expectedRelease(from: first, [(-clippedScale, 2, 1), (0.1, 1, 0)]),
                tolerance: 1e-6)
        }
    }

    /// A release whose step leaves Float's range is not published: the buffer starts again from the same checkpoint,
    /// and the devices still training keep their places.
    @Test func aNonFiniteReleaseIsNotPublished() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            // Every value finite (at most 2e38), but η_g = 4 takes the release past Float's range.
            var overflowing = Self.host(size: 1, concurrency: 3)
            overflowing.serverConfig.aggregator = AggregatorConfig(kind: .fedAvg, serverLearningRate: 4)
            let hosted = try await harness.host(overflowing)
            let e = try await harness.device(), f = try await harness.device()
            let je = try await harness.join(e), jf = try await harness.join(f)
            #expect(try await harness.report(e, je, diff: Fixture.diff(5e37), samples: 10, checkpoint: 0).status == 200)
            var status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 0 && status.checkpoints == [0])
            #expect(status.cyclesAbandoned == 1 && status.cyclesCompleted == 0)
            #expect(status.currentCycle?.number == 2 && status.currentCycle?.checkpoint == 0)
            #expect(status.currentCycle?.buffered?.releases == 0)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.host().weightsByName, tolerance: 0)
            let metrics = String(decoding: try await harness.http.send("GET", Endpoint.metrics).body, as: UTF8.self)
            #expect(metrics.contains(#"orchard_cycles_abandoned_total{reason="non_finite"} 1"#), "\(metrics)")
            // f, still training from checkpoint 0, reports into the new buffer with staleness 0: x₁ = x₀ + 4 · 0.1 (i + 1).
            #expect(try await harness.report(f, jf, diff: Fixture.diff(0.1), samples: 2, checkpoint: 0).status == 200)
            status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 1 && status.cyclesCompleted == 1)
            var expected = Fixture.host().weightsByName
            for (name, values) in expected where !name.hasPrefix("embed.") {
                expected[name] = values.indices.map { values[$0] + 4 * 0.1 * Float($0 + 1) }
            }
            expectClose(try await harness.checkpoint(hosted.processID), expected)
        }
    }

    @Test func aRestartKeepsTheBufferTheDevicesInFlightAndTheirStaleness() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(size: 2, concurrency: 4))
            let a = try await harness.device(), b = try await harness.device(), c = try await harness.device()
            let ja = try await harness.join(a), jb = try await harness.join(b), jc = try await harness.join(c)
            #expect(try await harness.report(a, ja, diff: Fixture.diff(0.1), samples: 3, checkpoint: 0).status == 200)
            #expect(try await harness.report(b, jb, diff: Fixture.diff(0.3), samples: 2, checkpoint: 0).status == 200)
            // c (carried into buffer 2) reports with staleness 1, then the coordinator restarts.
            #expect(try await harness.report(c, jc, diff: Fixture.diff(-0.2), samples: 5, checkpoint: 0).status == 200)
            let first = Self.expectedRelease(from: Fixture.host().weightsByName, [(0.1, 3, 0), (0.3, 2, 0)])
            try await harness.restart()
            let status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.buffered?.bufferFill == 1)
            // The buffer's staleness figures come back with it (c's report, one checkpoint stale).
            #expect(status.currentCycle?.buffered?.meanStaleness == 1 && status.currentCycle?.buffered?.maxStaleness == 1)
            #expect(try await harness.report(c, jc, diff: Fixture.diff(-0.2), samples: 5, checkpoint: 0).errorCode == "report_already_received")
            let d = try await harness.device()
            let jd = try await harness.join(d)
            #expect(jd.checkpoint == 1)
            #expect(try await harness.report(d, jd, diff: Fixture.diff(0.4), samples: 1, checkpoint: 1).status == 200)
            expectClose(try await harness.checkpoint(hosted.processID), Self.expectedRelease(from: first, [(-0.2, 5, 1), (0.4, 1, 0)]))
        }
    }
}

extension HostProcessRequest {
    /// The initial weights by tensor name.
    var weightsByName: [String: [Float]] {
        (try? Safetensors.decode(initialWeights).byName.mapValues(\.values)) ?? [:]
    }
}
