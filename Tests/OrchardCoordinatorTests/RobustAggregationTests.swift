import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import Testing

/// The robust rules against hand-computed aggregates, and `server_config.robust_aggregation` end to end.
@Suite struct RobustAggregationRuleTests {
    /// Five reports of three values: four close together and one far off (w4).
    static let reports: [(worker: String, samples: Int, values: [Float])] = [
        ("w1", 1, [1, 10, -1]), ("w2", 2, [2, 20, -2]), ("w3", 3, [3, 30, -3]), ("w4", 4, [100, -100, 50]), ("w5", 5, [4, 40, -4]),
    ]

    static func matrix(_ rows: [(worker: String, samples: Int, values: [Float])] = reports) throws -> ReportMatrix {
        let matrix = try ReportMatrix(columns: rows[0].values.count)
        for row in rows {
            try matrix.append(row.values.withUnsafeBytes { Array($0) }, worker: row.worker, sampleCount: row.samples)
        }
        return matrix
    }

    static func expectClose(_ actual: [Float], _ expected: [Double], sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(actual.count == expected.count, sourceLocation: sourceLocation)
        for (a, e) in zip(actual, expected) where abs(Double(a) - e) > 1e-5 {
            Issue.record("\(actual) != \(expected)", sourceLocation: sourceLocation)
            return
        }
    }

    @Test func medianOfAnOddAndAnEvenNumberOfReports() throws {
        let odd = try RobustAggregationConfig.median.aggregate(try Self.matrix())
        Self.expectClose(odd.delta, [3, 20, -2])
        #expect(odd.selected == ["w1", "w2", "w3", "w4", "w5"] && odd.reports == 5)
        // Even: the mean of the two middle values.
        let even = try RobustAggregationConfig.median.aggregate(try Self.matrix(Array(Self.reports.prefix(4))))
        Self.expectClose(even.delta, [2.5, 15, -1.5])
        // Ties: equal values are their own median.
        let tied = try RobustAggregationConfig.median.aggregate(
            try Self.matrix([("a", 1, [1, 7]), ("b", 1, [1, 7]), ("c", 1, [9, 7]), ("d", 1, [1, -7])]))
        Self.expectClose(tied.delta, [1, 7])
    }

    @Test func trimmedMeanCutsTheFloorOfBetaTimesNFromEachEnd() throws {
        // ⌊0.2 × 5⌋ = 1 from each end: the outlier goes.
        Self.expectClose(try RobustAggregationConfig.trimmedMean(trim: 0.2).aggregate(try Self.matrix()).delta, [3, 20, -2])
        // ⌊0.1 × 5⌋ = 0: the plain, unweighted mean.
        Self.expectClose(try RobustAggregationConfig.trimmedMean(trim: 0.1).aggregate(try Self.matrix()).delta, [22, 0, 8])
        // ⌊0.49 × 5⌋ = 2: only the median is left.
        Self.expectClose(try RobustAggregationConfig.trimmedMean(trim: 0.49).aggregate(try Self.matrix()).delta, [3, 20, -2])
        // ⌊0.29 × 100⌋ = 29 although 0.29 × 100 is 28.999… in floating point: values 0…99, 29 cut from each end.
        let hundred = try Self.matrix((0..<100).map { ("w\($0)", 1, [Float($0)]) })
        Self.expectClose(try RobustAggregationConfig.trimmedMean(trim: 0.29).aggregate(hundred).delta, [49.5])
        // A trim just under ½ with an even n would cut n/2 from each end, leaving nothing (0/0): at most (n − 1)/2 go.
        let four = try Self.matrix([("a", 1, [1]), ("b", 1, [2]), ("c", 1, [3]), ("d", 1, [10])])
        Self.expectClose(try RobustAggregationConfig.trimmedMean(trim: 0.4999999999).aggregate(four).delta, [2.5])
        // More than 64 reports take the general sort: the median of 0…99 is 49.5, of 0…100 (reversed) 50.
        Self.expectClose(try RobustAggregationConfig.median.aggregate(hundred).delta, [49.5])
        Self.expectClose(try RobustAggregationConfig.median.aggregate(try Self.matrix((0...100).reversed().map { ("w\($0)", 1, [Float($0)]) })).delta, [50])
    }

    @Test func multiKrumScoresByTheNearestNeighboursAndAveragesTheSelectedEachOnce() throws {
        // f = 1: scores sum the 2 smallest squared distances: w1 510, w2 204, w3 204, w4 51210, w5 510.
        let fourOfFive = try RobustAggregationConfig.multiKrum(byzantine: 1).aggregate(try Self.matrix())
        #expect(fourOfFive.selected == ["w1", "w2", "w3", "w5"])
        // Each selected report counts once, whatever sample count it claims.
        Self.expectClose(fourOfFive.delta, [2.5, 25, -2.5])
        let two = try RobustAggregationConfig.multiKrum(byzantine: 1, selected: 2).aggregate(try Self.matrix())
        #expect(two.selected == ["w2", "w3"])
        Self.expectClose(two.delta, [2.5, 25, -2.5])
        // Equal scores are broken by worker id, whatever order the store returned the reports in.
        let krum = try RobustAggregationConfig.multiKrum(byzantine: 1, selected: 1).aggregate(try Self.matrix(Self.reports.reversed()))
        #expect(krum.selected == ["w2"])
        Self.expectClose(krum.delta, [2, 20, -2])
        let three = try RobustAggregationConfig.multiKrum(byzantine: 1, selected: 3).aggregate(try Self.matrix([4, 2, 0, 3, 1].map { Self.reports[$0] }))
        #expect(three.selected == ["w1", "w2", "w3"])
        Self.expectClose(three.delta, [2, 20, -2])
    }

    @Test func multiKrumWithFAtItsLimit() throws {
        // n = f + 3: one neighbour each; w1, w2, w3 and w5 all score 102, w4 24502; m = n − f = 3 by worker id.
        let result = try RobustAggregationConfig.multiKrum(byzantine: 2).aggregate(try Self.matrix())
        #expect(result.selected == ["w1", "w2", "w3"])
        Self.expectClose(result.delta, [2, 20, -2])
        // One more assumed bad than five reports allow.
        let matrix = try Self.matrix()
        do throws(CoordinatorError) {
            _ = try RobustAggregationConfig.multiKrum(byzantine: 3).aggregate(matrix)
            Issue.record("multi_krum with f = 3 aggregated 5 reports")
        } catch {
            #expect(error.code == .invalidConfiguration && error.message.contains("at least 6 reports"), "\(error)")
        }
    }

    @Test(arguments: [RobustAggregationConfig.median, .trimmedMean(trim: 0.2), .multiKrum(byzantine: 1), .multiKrum(byzantine: 1, selected: 2)])
    func aNarrowBandGivesTheSameAggregateAsOneBand(rule: RobustAggregationConfig) throws {
        var rows = Self.reports
        // 37 columns, read 1 (5 values) or 2 (10 values) columns at a time.
        for i in rows.indices { rows[i].values = (0..<37).map { rows[i].values[$0 % 3] * Float(1 + $0 / 3) } }
        let whole = try rule.aggregate(try Self.matrix(rows))
        for band in [5, 10, 33] {
            let banded = try rule.aggregate(try Self.matrix(rows), bandValues: band)
            #expect(banded.delta == whole.delta && banded.selected == whole.selected, "band \(band)")
        }
    }

    @Test func aDiffOfTheWrongSizeIsRefused() throws {
        let matrix = try ReportMatrix(columns: 3)
        #expect(throws: CoordinatorError.self) { try matrix.append([0, 0, 0, 0], worker: "w", sampleCount: 1) }
        #expect(matrix.rows.isEmpty)
    }
}

@Suite struct RobustAggregationConfigTests {
    @Test func validation() {
        func failure(_ robust: RobustAggregationConfig, minimum: Int = 4, secure: Bool = false, privacy: Bool = false) -> String? {
            var config = ServerConfig(goalCount: 10, minimumReports: minimum, robustAggregation: robust)
            if secure {
                config.secureAggregation = SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 5))
                config.maximumSampleCount = 100
            }
            if privacy { config.privacy = PrivacyConfig(clippingNorm: 2, noiseMultiplier: 0.5, delta: 1e-5, population: 1000) }
            return config.validationFailure()
        }
        #expect(failure(.median) == nil)
        #expect(failure(.trimmedMean(trim: 0.1)) == nil)
        #expect(failure(.multiKrum(byzantine: 1)) == nil)
        #expect(failure(.multiKrum(byzantine: 1, selected: 3)) == nil)
        #expect(failure(RobustAggregationConfig(rule: .median, trim: 0.1))?.contains("median takes no trim") == true)
        #expect(failure(RobustAggregationConfig(rule: .trimmedMean))?.contains("trim is required") == true)
        for trim in [0, 0.5, -0.1, .nan] {
            #expect(failure(.trimmedMean(trim: trim))?.contains("trim must be in (0, 0.5)") == true, "\(trim)")
        }
        #expect(failure(RobustAggregationConfig(rule: .multiKrum))?.contains("byzantine (f, the reports assumed bad) is required") == true)
        #expect(failure(.multiKrum(byzantine: -1))?.contains("must not be negative") == true)
        #expect(failure(.multiKrum(byzantine: 2))?.contains("minimum_reports must be at least robust_aggregation.byzantine + 3 = 5") == true)
        #expect(failure(.multiKrum(byzantine: 1, selected: 4))?.contains("selected must be in 1...minimum_reports - byzantine = 3") == true)
        #expect(failure(.multiKrum(byzantine: 1, selected: 0))?.contains("selected must be in") == true)
        #expect(failure(.median, minimum: 6, secure: true)?.contains("cannot be used with server_config.secure_aggregation") == true)
        #expect(failure(.median, privacy: true)?.contains("cannot be used with server_config.privacy") == true)
        var wide = ServerConfig(goalCount: 800, overSelection: 1.3, minimumReports: 4, robustAggregation: .median)
        #expect(wide.validationFailure()?.contains("takes at most 1000 devices a cycle (goal_count × over_selection = 1040)") == true)
        wide.overSelection = 1.25
        #expect(wide.validationFailure() == nil)
    }

    @Test func wireForm() throws {
        let decoded = try WireCoding.decoder().decode(
            ServerConfig.self, from: Data(#"{"goal_count": 5, "robust_aggregation": {"rule": "multi_krum", "byzantine": 1, "selected": 2}}"#.utf8))
        #expect(decoded.robustAggregation == .multiKrum(byzantine: 1, selected: 2))
        let encoded = String(decoding: try WireCoding.encoder().encode(ServerConfig(robustAggregation: .trimmedMean(trim: 0.1))), as: UTF8.self)
        #expect(encoded.contains(#""robust_aggregation":{"rule":"trimmed_mean","trim":0.1}"#), "\(encoded)")
        #expect(throws: DecodingError.self) {
            try WireCoding.decoder().decode(RobustAggregationConfig.self, from: Data(#"{"rule": "krum"}"#.utf8))
        }
        #expect(throws: DecodingError.self) {
            try WireCoding.strictDecoder().decode(RobustAggregationConfig.self, from: Data(#"{"rule": "median", "beta": 0.1}"#.utf8))
        }
        #expect(throws: DecodingError.self) { try WireCoding.decoder().decode(RobustAggregationConfig.self, from: Data(#"{"trim": 0.1}"#.utf8)) }
        #expect(RobustAggregationConfig.multiKrum(byzantine: 2, selected: 5).summary == "multi_krum(f=2,m=5)")
    }
}

/// Robust rules over loopback HTTP with a real SQLite file.
@Suite(.serialized) struct RobustAggregationCoordinatorTests {
    static func host(_ rule: RobustAggregationConfig, goal: Int) -> HostProcessRequest {
        var request = Fixture.host(goal: goal, minimum: goal, overSelection: 1)
        request.serverConfig.robustAggregation = rule
        return request
    }

    /// Three honest reports and one poisoned, as (scale, samples).
    static let reports: [(scale: Float, samples: Int)] = [(0.1, 5), (0.2, 1), (0.3, 2), (50, 1)]

    /// Each rule with the reports (scale, samples) whose FedAvg equals its aggregate.
    static let cases: [(rule: RobustAggregationConfig, equivalent: [Float])] = [
        (.median, [0.25]), (.trimmedMean(trim: 0.25), [0.25]), (.multiKrum(byzantine: 1), [0.2]),
    ]

    @Test(arguments: 0..<3)
    func aPoisonedReportDoesNotMoveTheCheckpoint(index: Int) async throws {
        let (rule, equivalent) = Self.cases[index]
        let expected = equivalent.map { ($0, 1) }
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(rule, goal: 4))
            #expect(hosted.serverConfig.robustAggregation == rule)
            var devices: [(AuthenticateResponse, CycleAssignment)] = []
            for _ in Self.reports {
                let device = try await harness.device()
                devices.append((device, try await harness.join(device)))
            }
            for ((device, assignment), report) in zip(devices, Self.reports) {
                #expect(try await harness.report(device, assignment, diff: Fixture.diff(report.scale), samples: report.samples).status == 200)
            }
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(expected.map { (scale: $0.0, samples: $0.1) }))
            let raw = try await harness.http.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: Harness.adminToken)
            #expect(try Safetensors.decode(raw.body).metadata["orchard.robust_aggregation"]?.hasPrefix(rule.summary) == true)
        }
    }

    @Test func aRestartMidCycleAggregatesExactlyTheAcknowledgedReports() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(.median, goal: 3))
            var devices: [(AuthenticateResponse, CycleAssignment)] = []
            for _ in 0..<3 {
                let device = try await harness.device()
                devices.append((device, try await harness.join(device)))
            }
            #expect(try await harness.report(devices[0].0, devices[0].1, diff: Fixture.diff(0.4), samples: 1).status == 200)
            #expect(try await harness.report(devices[1].0, devices[1].1, diff: Fixture.diff(-7), samples: 1).status == 200)
            try await harness.restart()
            // The same key again after the restart: a duplicate, not a second vote.
            #expect(try await harness.report(devices[1].0, devices[1].1, diff: Fixture.diff(-7), samples: 1).status == 409)
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 0)
            #expect(try await harness.report(devices[2].0, devices[2].1, diff: Fixture.diff(0.6), samples: 1).status == 200)
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([(0.4, 1)]))
        }
    }

    @Test func theServerOptimizerStepsWithTheRobustAggregate() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Self.host(.median, goal: 3)
            request.serverConfig.aggregator = AggregatorConfig(kind: .fedAvgM, serverLearningRate: 0.5, momentum: 0.9)
            let hosted = try await harness.host(request)
            for scale: Float in [0.2, 0.4, 90] {
                let device = try await harness.device()
                let assignment = try await harness.join(device)
                #expect(try await harness.report(device, assignment, diff: Fixture.diff(scale), samples: 1).status == 200)
            }
            // FedAvgM's first step from zero momentum: x + η·median = x + 0.5 × 0.4.
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([(0.2, 1)]))
        }
    }

    @Test func refusedWithSecureAggregationOrPrivacyOrAnUnknownRule() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var secure = Self.host(.median, goal: 4)
            secure.serverConfig.secureAggregation = SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 2))
            secure.serverConfig.maximumSampleCount = 100
            var privacy = Self.host(.median, goal: 4)
            privacy.serverConfig.privacy = PrivacyConfig(clippingNorm: 2, noiseMultiplier: 0.5, delta: 1e-5, population: 1000)
            let krum = Self.host(.multiKrum(byzantine: 2), goal: 4)
            for (request, words) in [(secure, "never sees a single update"), (privacy, "calibrated"), (krum, "byzantine + 3")] {
                let result = try await harness.http.json("POST", Endpoint.processes, request, token: Harness.adminToken)
                #expect(result.status == 400 && result.errorCode == "invalid_configuration")
                #expect(try result.decode(ErrorBody.self).error.message.contains(words), "\(String(decoding: result.body, as: UTF8.self))")
            }
            var json = try #require(try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(Self.host(.median, goal: 4))) as? [String: Any])
            var server = try #require(json["server_config"] as? [String: Any])
            server["robust_aggregation"] = ["rule": "bulyan"]
            json["server_config"] = server
            let unknown = try await harness.http.send(
                "POST", Endpoint.processes, body: Array(try JSONSerialization.data(withJSONObject: json)), token: Harness.adminToken)
            #expect(unknown.status == 400 && unknown.errorCode == "invalid_configuration")
            #expect(try unknown.decode(ErrorBody.self).error.message.contains("bulyan"))
            #expect(try await harness.http.send("GET", Endpoint.processes, token: Harness.adminToken).decode(ProcessList.self).processes.isEmpty)
        }
    }
}
