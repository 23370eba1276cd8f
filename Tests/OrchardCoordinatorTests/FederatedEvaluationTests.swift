import Foundation
@testable import OrchardCoordinator
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Testing

/// Federated evaluation over loopback HTTP with a real SQLite file: evaluation tasks handed out to devices that take
/// them, their results aggregated once per checkpoint, and every way a result can be wrong refused.
@Suite(.serialized) struct FederatedEvaluationTests {
    static func host(
        goal: Int = 2, evaluation: FederatedEvaluationConfig? = FederatedEvaluationConfig(goal: 2), holdout: Double? = 0.25,
        maximumSampleCount: Int = 1000, name: String = "evaluated"
    ) -> HostProcessRequest {
        var request = ServerEvaluationTests.host(goal: goal)
        request.name = name
        request.clientConfig.holdoutFraction = holdout
        request.serverConfig.evaluation = evaluation
        request.serverConfig.maximumSampleCount = maximumSampleCount
        request.serverConfig.cycleLength = 3600
        request.serverConfig.overSelection = 2
        return request
    }

    /// A cycle request that offers `tasks`.
    static func check(in harness: Harness, _ device: AuthenticateResponse, tasks: [DeviceTask]? = [.evaluation, .training], name: String = "evaluated")
        async throws -> CycleResponse
    {
        let request = CycleRequest(workerID: device.workerID, processName: name, processVersion: SemanticVersion(1, 0), tasks: tasks)
        let result = try await harness.http.json("POST", Endpoint.cycleRequest, request, token: device.sessionToken)
        #expect(result.status == 200, "\(String(decoding: result.body, as: UTF8.self))")
        return try result.decode(CycleResponse.self)
    }

    static func task(in harness: Harness, _ device: AuthenticateResponse, name: String = "evaluated") async throws -> EvaluationAssignment {
        guard case .evaluate(let task) = try await check(in: harness, device, name: name) else {
            throw HarnessError(description: "device \(device.workerID) was given no evaluation task")
        }
        return task
    }

    static func send(
        _ harness: Harness, _ device: AuthenticateResponse, key: String, samples: Int, metrics: [String: Double], worker: String? = nil
    ) async throws -> HTTPResult {
        let report = EvaluationReport(workerID: worker ?? device.workerID, requestKey: key, samples: samples, metrics: metrics)
        return try await harness.http.json("POST", Endpoint.evaluationReport, report, token: device.sessionToken)
    }

    static func regressor(loss: Double, mae: Double) -> [String: Double] { ["loss": loss, "rmse": loss.squareRoot(), "mae": mae] }

    /// Under evaluation noise the release sums fixed metrics (`loss` and, for this regressor, `mae`): a result without
    /// one is refused, not counted as 0 at full weight.
    @Test func underNoiseAResultWithoutAReleasedMetricIsRefused() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Self.host(
                evaluation: FederatedEvaluationConfig(goal: 2, noise: EvaluationNoise(noiseMultiplier: 1, maximumSamples: 10, lossBound: 2)))
            request.serverConfig.privacy = PrivacyConfig(mode: .central, clippingNorm: 1, noiseMultiplier: 1, population: 1000)
            let hosted = try await harness.host(request)
            #expect(hosted.serverConfig.evaluation?.noise != nil)
            let device = try await harness.device(name: "evaluated")
            let task = try await Self.task(in: harness, device)
            let lossOnly = try await Self.send(harness, device, key: task.requestKey, samples: 4, metrics: ["loss": 1])
            #expect(lossOnly.status == 400 && lossOnly.errorCode == "invalid_request", "\(String(decoding: lossOnly.body, as: UTF8.self))")
            #expect((try? lossOnly.decode(ErrorBody.self))?.error.message.contains("'mae'") == true)
            let complete = try await Self.send(harness, device, key: task.requestKey, samples: 4, metrics: Self.regressor(loss: 1, mae: 0.5))
            #expect(complete.status == 200, "\(String(decoding: complete.body, as: UTF8.self))")
        }
    }

    @Test func resultsAggregateToTheSampleWeightedMeanOncePerCheckpointAndStayInTheHistory() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host())
            let id = hosted.processID
            let (d1, d2, d3, d4) = (
                try await harness.device(name: "evaluated"), try await harness.device(name: "evaluated"), try await harness.device(name: "evaluated"),
                try await harness.device(name: "evaluated")
            )
            // A device that does not offer evaluation is never given it.
            guard case .accepted(let t4) = try await Self.check(in: harness, d4, tasks: nil) else { throw HarnessError(description: "d4 rejected") }

            let e1 = try await Self.task(in: harness, d1)
            #expect(e1.checkpoint == 0 && e1.modelID == "\(id).0" && e1.planID == id && e1.requestKey.hasPrefix("e.") && e1.reportWithin == 300)
            let plan = try await harness.http.send("GET", Endpoint.plan(id) + "?request_key=\(e1.requestKey)", token: d1.sessionToken)
            #expect(plan.status == 200)
            let decodedPlan = try plan.decode(TrainingPlan.self)
            #expect(decodedPlan.clientConfig.holdoutFraction == 0.25)
            let model = try await harness.http.send("GET", Endpoint.model(e1.modelID) + "?request_key=\(e1.requestKey)", token: d1.sessionToken)
            #expect(model.status == 200)
            #expect(
                try Safetensors.decode(model.body).byName.mapValues(\.values)
                    == Dictionary(uniqueKeysWithValues: ServerEvaluationTests.weights.map { ($0.name, $0.values) }))

            let first = try await Self.send(harness, d1, key: e1.requestKey, samples: 3, metrics: Self.regressor(loss: 0.5, mae: 0.4))
            #expect(first.status == 200, "\(String(decoding: first.body, as: UTF8.self))")
            #expect(try first.decode(EvaluationReportResponse.self) == EvaluationReportResponse(checkpoint: 0, resultsReceived: 1))
            let again = try await Self.send(harness, d1, key: e1.requestKey, samples: 3, metrics: Self.regressor(loss: 0.5, mae: 0.4))
            #expect(again.status == 409 && again.errorCode == "evaluation_already_received")
            // Evaluated, the device goes on to train in the same window.
            guard case .accepted(let t1) = try await Self.check(in: harness, d1) else { throw HarnessError(description: "d1 was not admitted") }
            #expect(try await harness.status(id).federatedEvaluation == nil)

            let e2 = try await Self.task(in: harness, d2)
            let second = try await Self.send(harness, d2, key: e2.requestKey, samples: 1, metrics: Self.regressor(loss: 1, mae: 0.8))
            #expect(try second.decode(EvaluationReportResponse.self).resultsReceived == 2)
            // The goal is met: the evaluation is the sample-weighted mean, with the RMSE of the mean loss.
            let evaluation = try #require(try await harness.status(id).federatedEvaluation)
            #expect(evaluation.checkpoint == 0 && evaluation.samples == 4 && evaluation.devices == 2 && evaluation.epsilon == nil)
            #expect(abs(evaluation.metrics["loss"]! - 0.625) < 1e-12 && abs(evaluation.metrics["mae"]! - 0.5) < 1e-12)
            #expect(abs(evaluation.metrics["rmse"]! - 0.625.squareRoot()) < 1e-12)
            // Finalized: no more tasks for checkpoint 0, and a late result is refused.
            guard case .accepted = try await Self.check(in: harness, d3) else { throw HarnessError(description: "d3 was not admitted") }
            let late = try await Self.send(harness, d2, key: e2.requestKey, samples: 1, metrics: Self.regressor(loss: 1, mae: 0.8))
            #expect(late.status == 409)

            // Checkpoint 1: d1 and d4 report, the cycle (goal 2) closes.
            let diff = [
                TensorRecord(name: "out.bias", shape: [1], values: [0.4]), TensorRecord(name: "out.weight", shape: [1, 3], values: [0.1, 0.2, 0.3]),
            ]
            #expect(try await harness.report(d1, t1, diff: diff, samples: 3).status == 200)
            #expect(try await harness.report(d4, t4, diff: diff, samples: 3).status == 200)
            #expect(try await harness.status(id).latestCheckpoint == 1)
            // d2's old key is for a checkpoint that is no longer the latest.
            let stale = try await harness.http.send("GET", Endpoint.model(e1.modelID) + "?request_key=\(e2.requestKey)", token: d2.sessionToken)
            #expect(stale.status == 409 && stale.errorCode == "evaluation_closed")

            let e21 = try await Self.task(in: harness, d2)
            #expect(e21.checkpoint == 1)
            #expect(try await Self.send(harness, d2, key: e21.requestKey, samples: 5, metrics: Self.regressor(loss: 0.2, mae: 0.1)).status == 200)
            // Checkpoint 2 is published with one result for checkpoint 1: that evaluation is finalized as it stands.
            for device in [d1, d4] {
                guard case .accepted(let assignment) = try await Self.check(in: harness, device, tasks: [.training]) else {
                    throw HarnessError(description: "not admitted")
                }
                #expect(try await harness.report(device, assignment, diff: diff, samples: 2).status == 200)
            }
            #expect(try await harness.status(id).latestCheckpoint == 2)
            let listed = try await harness.http.send("GET", Endpoint.evaluation(id), token: Harness.adminToken).decode(ProcessEvaluations.self)
            #expect(listed.federated.map(\.checkpoint) == [0, 1])
            #expect(listed.federated[1].devices == 1 && listed.federated[1].samples == 5 && listed.federated[1].metrics["loss"] == 0.2)
            let cycles = try await harness.http.send("GET", Endpoint.cycles(id), token: Harness.adminToken).decode(ProcessCycles.self)
            #expect(cycles.cycles.map(\.federatedEvaluation?.checkpoint) == [1, nil])
            let metrics = String(decoding: try await harness.http.send("GET", Endpoint.metrics).body, as: UTF8.self)
            #expect(metrics.contains(#"orchard_federated_evaluation_checkpoint{"#) && metrics.contains("orchard_evaluation_results_total"), "\(metrics)")
        }
    }

    /// With `maximum_samples` one device that claims a huge held-out split weighs no more than the cap: without it,
    /// the device claiming 1,000 samples would set the mean (0.999 of the weight) alone.
    @Test func aCappedResultCannotSetTheMeanAlone() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(evaluation: FederatedEvaluationConfig(goal: 2, maximumSamples: 10)))
            let (honest, loud) = (try await harness.device(name: "evaluated"), try await harness.device(name: "evaluated"))
            let e1 = try await Self.task(in: harness, honest)
            #expect(try await Self.send(harness, honest, key: e1.requestKey, samples: 10, metrics: Self.regressor(loss: 1, mae: 1)).status == 200)
            let e2 = try await Self.task(in: harness, loud)
            #expect(try await Self.send(harness, loud, key: e2.requestKey, samples: 1000, metrics: Self.regressor(loss: 9, mae: 9)).status == 200)
            let evaluation = try #require(try await harness.status(hosted.processID).federatedEvaluation)
            // Equal weights: (1 + 9) / 2. The sample count is still the one the devices evaluated.
            #expect(evaluation.metrics["loss"] == 5 && evaluation.metrics["mae"] == 5 && evaluation.samples == 1010)
        }
    }

    @Test func everyWayAResultCanBeWrongIsRefused() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(evaluation: FederatedEvaluationConfig(goal: 5), maximumSampleCount: 50))
            let other = try await harness.host(Self.host(name: "other"))
            let d1 = try await harness.device(name: "evaluated")
            let d2 = try await harness.device(name: "evaluated")
            let stranger = try await harness.device(name: "other")
            let e1 = try await Self.task(in: harness, d1)
            let e2 = try await Self.task(in: harness, d2)
            let foreign = try await Self.task(in: harness, stranger, name: "other")
            let good = Self.regressor(loss: 0.5, mae: 0.4)
            func refused(_ result: HTTPResult) -> (Int, String?) { (result.status, result.errorCode) }

            var forged = Array(e1.requestKey)
            forged[forged.count - 1] = forged.last == "0" ? "1" : "0"
            #expect(refused(try await Self.send(harness, d1, key: String(forged), samples: 2, metrics: good)) == (403, "invalid_request_key"))
            #expect(refused(try await Self.send(harness, d1, key: e2.requestKey, samples: 2, metrics: good)) == (403, "invalid_request_key"))
            #expect(refused(try await Self.send(harness, d1, key: foreign.requestKey, samples: 2, metrics: good)) == (403, "invalid_request_key"))
            #expect(refused(try await Self.send(harness, d1, key: "e.0.99999999999.zz", samples: 2, metrics: good)) == (403, "invalid_request_key"))
            #expect(refused(try await Self.send(harness, d1, key: "e.-1.5.00", samples: 2, metrics: good)) == (403, "invalid_request_key"))
            #expect(refused(try await Self.send(harness, d1, key: e1.requestKey, samples: 2, metrics: good, worker: d2.workerID)) == (403, "forbidden"))
            #expect(refused(try await Self.send(harness, d1, key: e1.requestKey, samples: 0, metrics: good)) == (400, "invalid_request"))
            #expect(refused(try await Self.send(harness, d1, key: e1.requestKey, samples: 51, metrics: good)) == (422, "invalid_sample_count"))
            #expect(refused(try await Self.send(harness, d1, key: e1.requestKey, samples: 2, metrics: ["mae": 0.1])) == (400, "invalid_request"))
            let many = Dictionary(uniqueKeysWithValues: (0..<17).map { ("m\($0)", 0.1) }).merging(["loss": 1]) { a, _ in a }
            #expect(refused(try await Self.send(harness, d1, key: e1.requestKey, samples: 2, metrics: many)) == (400, "invalid_request"))
            #expect(refused(try await Self.send(harness, d1, key: e1.requestKey, samples: 2, metrics: ["loss": 1, "": 2])) == (400, "invalid_request"))
            for wrong: [String: Double] in [["loss": 1e300], ["loss": -1], ["loss": 1, "accuracy": 1.5], ["loss": 1, "mae": -0.1]] {
                #expect(refused(try await Self.send(harness, d1, key: e1.requestKey, samples: 2, metrics: wrong)) == (400, "invalid_request"), "\(wrong)")
            }
            // Numbers JSON cannot carry, and bodies that are not a report.
            for body in [
                #"{"worker_id":"\#(d1.workerID)","request_key":"\#(e1.requestKey)","samples":2,"metrics":{"loss":1e999}}"#,
                #"{"worker_id":"\#(d1.workerID)","request_key":"\#(e1.requestKey)","samples":2}"#, "[]", "not json",
            ] {
                let result = try await harness.http.send(
                    "POST", Endpoint.evaluationReport, body: Array(body.utf8), token: d1.sessionToken, headers: ["Content-Type": MediaType.json])
                #expect(result.status == 400, "\(body): \(String(decoding: result.body, as: UTF8.self))")
            }
            let oversized = try await harness.http.send(
                "POST", Endpoint.evaluationReport, body: [UInt8](repeating: 0x20, count: 70_000), token: d1.sessionToken,
                headers: ["Content-Type": MediaType.json])
            #expect(oversized.status == 413)
            // Sessions: none, forged, and one of another process.
            let report = EvaluationReport(workerID: d1.workerID, requestKey: e1.requestKey, samples: 2, metrics: good)
            #expect(try await harness.http.json("POST", Endpoint.evaluationReport, report).status == 401)
            #expect(try await harness.http.json("POST", Endpoint.evaluationReport, report, token: d1.sessionToken + "x").status == 401)
            let crossed = EvaluationReport(workerID: stranger.workerID, requestKey: e1.requestKey, samples: 2, metrics: good)
            #expect(
                refused(try await harness.http.json("POST", Endpoint.evaluationReport, crossed, token: stranger.sessionToken)) == (403, "invalid_request_key"))
            // An evaluation key is not a training key, and a training key is not an evaluation key.
            let asTraining = ReportEnvelope.encode(
                diff: [TensorRecord(name: "out.bias", shape: [1], values: [0]), TensorRecord(name: "out.weight", shape: [1, 3], values: [0, 0, 0])],
                metadata: ReportMetadata(workerID: d1.workerID, requestKey: e1.requestKey, sampleCount: 1))
            let training = try await harness.http.send(
                "POST", Endpoint.report, body: asTraining, token: d1.sessionToken, headers: ["Content-Type": MediaType.safetensors])
            #expect(training.status == 403 && training.errorCode == "invalid_request_key")
            guard case .accepted(let assignment) = try await Self.check(in: harness, d1, tasks: [.training]) else {
                throw HarnessError(description: "not admitted")
            }
            #expect(refused(try await Self.send(harness, d1, key: assignment.requestKey, samples: 2, metrics: good)) == (403, "invalid_request_key"))
            // Expired: past report_within, the task is gone.
            harness.clock.advance(bySeconds: 301)
            #expect(refused(try await Self.send(harness, d1, key: e1.requestKey, samples: 2, metrics: good)) == (409, "deadline_passed"))
            let status = try await harness.status(hosted.processID)
            #expect(status.federatedEvaluation == nil)
            _ = other
        }
    }

    @Test func aKeyHandedOutBeforeARestartIsHonouredAfterIt() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(evaluation: FederatedEvaluationConfig(goal: 1)))
            let device = try await harness.device(name: "evaluated")
            let task = try await Self.task(in: harness, device)
            try await harness.restart()
            let result = try await Self.send(harness, device, key: task.requestKey, samples: 4, metrics: Self.regressor(loss: 0.3, mae: 0.2))
            #expect(result.status == 200, "\(String(decoding: result.body, as: UTF8.self))")
            let evaluation = try #require(try await harness.status(hosted.processID).federatedEvaluation)
            #expect(evaluation.samples == 4 && evaluation.metrics["loss"] == 0.3)
        }
    }

    @Test func anInstanceThatDidNotFinalizeHandsOutNoTaskForAFinalizedCheckpoint() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(evaluation: FederatedEvaluationConfig(goal: 1)))
            let first = try await harness.device(name: "evaluated")
            let task = try await Self.task(in: harness, first)
            #expect(try await Self.send(harness, first, key: task.requestKey, samples: 3, metrics: Self.regressor(loss: 0.2, mae: 0.1)).status == 200)
            #expect(try await harness.status(hosted.processID).federatedEvaluation?.checkpoint == 0)
            // After a restart the coordinator's memory is empty; the store says checkpoint 0 is done.
            try await harness.restart()
            let second = try await harness.device(name: "evaluated")
            guard case .accepted = try await Self.check(in: harness, second) else {
                throw HarnessError(description: "a finalized checkpoint still handed out an evaluation task after a restart")
            }
        }
    }

    @Test func aCheckpointWhoseGoalWasMetBeforeACrashIsFinalizedAtStartUp() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Self.host(evaluation: FederatedEvaluationConfig(goal: 2)))
            // Two results stored straight into the store, as if the coordinator died before finalizing.
            for (worker, loss) in [("w_a", 0.5), ("w_b", 1.5)] {
                _ = try await harness.coordinator.store.recordEvaluationResult(
                    StoredEvaluationResult(checkpoint: 0, workerID: worker, samples: 2, metrics: ["loss": loss], receivedAt: 1), processID: hosted.processID)
            }
            #expect(try await harness.status(hosted.processID).federatedEvaluation == nil)
            try await harness.restart()
            let evaluation = try #require(try await harness.status(hosted.processID).federatedEvaluation)
            #expect(evaluation.checkpoint == 0 && evaluation.devices == 2 && evaluation.metrics["loss"] == 1)
        }
    }

    @Test func unusableConfigurationsAreRefusedWithTheirReason() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            func refusal(_ request: HostProcessRequest) async throws -> String {
                let result = try await harness.http.json("POST", Endpoint.processes, request, token: Harness.adminToken)
                #expect(result.status == 400 && result.errorCode == "invalid_configuration")
                return (try? result.decode(ErrorBody.self).error.message) ?? ""
            }
            #expect(try await refusal(Self.host(holdout: nil)).contains("client_config.holdout_fraction"))
            #expect(try await refusal(Self.host(holdout: 0)).contains("client_config.holdout_fraction"))
            #expect(try await refusal(Self.host(holdout: 0.95)).contains("[0, 0.9]"))
            #expect(try await refusal(Self.host(evaluation: FederatedEvaluationConfig(every: 0, goal: 2))).contains("every"))
            #expect(try await refusal(Self.host(evaluation: FederatedEvaluationConfig(goal: 0))).contains("goal"))
            #expect(try await refusal(Self.host(evaluation: FederatedEvaluationConfig(goal: 2, fraction: 0))).contains("fraction"))
            #expect(try await refusal(Self.host(evaluation: FederatedEvaluationConfig(goal: 2, maximumSamples: 0))).contains("maximum_samples"))
            let noisy = FederatedEvaluationConfig(goal: 2, noise: EvaluationNoise(noiseMultiplier: 1, maximumSamples: 10, lossBound: 2))
            #expect(try await refusal(Self.host(evaluation: noisy)).contains("needs server_config.privacy"))
            var twoCaps = noisy
            twoCaps.maximumSamples = 20
            #expect(try await refusal(Self.host(evaluation: twoCaps)).contains("differs from server_config.evaluation.noise.maximum_samples"))
            var secure = Self.host()
            secure.serverConfig.goalCount = 4
            secure.serverConfig.minimumReports = 4
            secure.serverConfig.secureAggregation = SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 2))
            #expect(try await refusal(secure).contains("in the clear"))
            var local = Self.host()
            local.serverConfig.privacy = PrivacyConfig(mode: .local, clippingNorm: 1, noiseMultiplier: 1, population: 1000)
            #expect(try await refusal(local).contains("privacy.mode local"))
            // An unknown key inside server_config.evaluation.
            var json = try JSONSerialization.jsonObject(with: try WireCoding.encoder().encode(Self.host())) as! [String: Any]
            var server = json["server_config"] as! [String: Any]
            server["evaluation"] = ["goal": 2, "goals": 3]
            json["server_config"] = server
            let unknown = try await harness.http.send(
                "POST", Endpoint.processes, body: Array(try JSONSerialization.data(withJSONObject: json)), token: Harness.adminToken,
                headers: ["Content-Type": MediaType.json])
            #expect(unknown.status == 400 && String(decoding: unknown.body, as: UTF8.self).contains("goals"))
        }
    }
}

/// The pure parts: the aggregate, the keys and the task bookkeeping.
@Suite struct FederatedEvaluationLogicTests {
    static func result(_ worker: String, _ samples: Int, _ metrics: [String: Double]) -> StoredEvaluationResult {
        StoredEvaluationResult(checkpoint: 3, workerID: worker, samples: samples, metrics: metrics, receivedAt: 0)
    }

    @Test func aClassifiersResultsAverageBySamplesAndPerplexityComesFromTheMeanLoss() {
        var generator = SplitMix64(seed: 1)
        let evaluation = FederatedEvaluationAggregate.combine(
            [
                Self.result("a", 10, ["loss": 1, "accuracy": 0.5, "perplexity": exp(1)]),
                Self.result("b", 30, ["loss": 2, "accuracy": 0.9, "perplexity": exp(2), "custom": 4]),
            ], checkpoint: 3, loss: .crossEntropy, noise: nil, epsilon: nil, at: 7, using: &generator)
        #expect(evaluation.samples == 40 && evaluation.devices == 2 && evaluation.evaluatedAt == 7 && evaluation.checkpoint == 3)
        #expect(evaluation.metrics["loss"] == 1.75)
        #expect(abs(evaluation.metrics["accuracy"]! - 0.8) < 1e-12)
        #expect(abs(evaluation.metrics["perplexity"]! - exp(1.75)) < 1e-9)
        // A metric only some devices sent is averaged over those.
        #expect(evaluation.metrics["custom"] == 4)
    }

    /// Sample counts as large as an operator's `maximum_sample_count` may allow add up without overflowing (the sum
    /// trapped inside the store's finalize transaction, again on every restart).
    @Test func sampleCountsNearIntMaxSaturate() {
        var generator = SplitMix64(seed: 3)
        let evaluation = FederatedEvaluationAggregate.combine(
            [Self.result("a", 5_000_000_000_000_000_000, ["loss": 1]), Self.result("b", 5_000_000_000_000_000_000, ["loss": 3])],
            checkpoint: 3, loss: .meanSquaredError, noise: nil, epsilon: nil, at: 1, using: &generator)
        #expect(evaluation.samples == Int.max)
        #expect(evaluation.metrics["loss"] == 2)
    }

    @Test func theCapWeighsEachResultAtMostMaximumSamples() throws {
        var generator = SplitMix64(seed: 4)
        let results = [Self.result("a", 4, ["loss": 1]), Self.result("b", 50, ["loss": 3]), Self.result("c", 6, ["loss": 2])]
        let capped = FederatedEvaluationAggregate.combine(
            results, checkpoint: 3, loss: .meanSquaredError, maximumSamples: 5, noise: nil, epsilon: nil, at: 1, using: &generator)
        // Weights 4, 5, 5: (4·1 + 5·3 + 5·2) / 14.
        #expect(abs(capped.metrics["loss"]! - 29.0 / 14) < 1e-12 && capped.samples == 60)
        let uncapped = FederatedEvaluationAggregate.combine(results, checkpoint: 3, loss: .meanSquaredError, noise: nil, epsilon: nil, at: 1, using: &generator)
        #expect(abs(uncapped.metrics["loss"]! - 166.0 / 60) < 1e-12)
        // The key decodes; unset stays unset.
        let decoded = try JSONDecoder().decode(FederatedEvaluationConfig.self, from: Data(#"{"goal": 3, "maximum_samples": 7}"#.utf8))
        #expect(decoded.maximumSamples == 7 && decoded.validationFailure() == nil)
        #expect(try JSONDecoder().decode(FederatedEvaluationConfig.self, from: Data(#"{"goal": 3}"#.utf8)).maximumSamples == nil)
        // Under noise the two caps may coincide.
        let same = FederatedEvaluationConfig(goal: 2, maximumSamples: 10, noise: EvaluationNoise(noiseMultiplier: 1, maximumSamples: 10, lossBound: 2))
        #expect(same.validationFailure() == nil)
    }

    /// A sequence model's accuracy and perplexity are means over positions: one device's 100 positions outweigh another's
    /// single tail position, and perplexity is the exponential of the mean cross-entropy per position, not of the mean
    /// per-sample loss. Before, this gave accuracy 0.45 and perplexity e² for what is 90/101 and exp(103/101).
    @Test func aSequenceModelsAccuracyAndPerplexityAreMeansOverPositions() {
        var generator = SplitMix64(seed: 5)
        let long = StoredEvaluationResult(
            checkpoint: 3, workerID: "a", samples: 1, metrics: ["loss": 1, "accuracy": 0.9, "perplexity": exp(1)], receivedAt: 0, positions: 100)
        let tail = StoredEvaluationResult(
            checkpoint: 3, workerID: "b", samples: 1, metrics: ["loss": 3, "accuracy": 0, "perplexity": exp(3)], receivedAt: 0, positions: 1)
        let evaluation = FederatedEvaluationAggregate.combine(
            [long, tail], checkpoint: 3, loss: .crossEntropy, noise: nil, epsilon: nil, at: 1, using: &generator)
        #expect(abs(evaluation.metrics["accuracy"]! - 90.0 / 101) < 1e-12)
        #expect(abs(evaluation.metrics["perplexity"]! - exp(103.0 / 101)) < 1e-9)
        // The loss stays the mean per sample, as each device's is.
        #expect(evaluation.metrics["loss"] == 2 && evaluation.metrics.count == 3)
        // Capped at two samples, a device of four samples and 40 positions weighs 20 positions.
        let big = StoredEvaluationResult(
            checkpoint: 3, workerID: "c", samples: 4, metrics: ["loss": 1, "accuracy": 1, "perplexity": exp(2)], receivedAt: 0, positions: 40)
        let small = StoredEvaluationResult(
            checkpoint: 3, workerID: "d", samples: 2, metrics: ["loss": 1, "accuracy": 0, "perplexity": exp(1)], receivedAt: 0, positions: 20)
        let capped = FederatedEvaluationAggregate.combine(
            [big, small], checkpoint: 3, loss: .crossEntropy, maximumSamples: 2, noise: nil, epsilon: nil, at: 1, using: &generator)
        #expect(capped.metrics["accuracy"] == 0.5 && abs(capped.metrics["perplexity"]! - exp(1.5)) < 1e-9)
    }

    /// No metric name steers the aggregate's perplexity: a key an earlier version used internally is only a name now
    /// (and the wire refuses it besides, for its leading space).
    @Test func noMetricNameSetsThePerplexity() {
        var generator = SplitMix64(seed: 6)
        let forged = StoredEvaluationResult(
            checkpoint: 3, workerID: "a", samples: 2, metrics: ["loss": 0.5, " log perplexity": -40], receivedAt: 0, positions: 10)
        let evaluation = FederatedEvaluationAggregate.combine([forged], checkpoint: 3, loss: .crossEntropy, noise: nil, epsilon: nil, at: 1, using: &generator)
        #expect(evaluation.metrics["perplexity"] == nil && evaluation.metrics[" log perplexity"] == -40)
    }

    @Test func aSequenceModelsResultMustCarryItsPositions() throws {
        let sequence = ModelSpec(
            name: "tagger", inputs: [InputSpec(name: "x", shape: [4, 2])],
            layers: [
                LayerSpec(name: "out", type: .dense, inputs: ["x"], units: 3, inputSize: 2, useBias: true),
                LayerSpec(name: "p", type: .softmax, inputs: ["out"]),
            ], training: TrainingSpec(loss: .crossEntropy, optimizer: .sgd(learningRate: 0.1), epochs: 1, batchSize: 4))
        func check(_ model: ModelSpec, samples: Int, positions: Int?) -> String? {
            let report = EvaluationReport(workerID: "w", requestKey: "k", samples: samples, metrics: ["loss": 1], positions: positions)
            do throws(CoordinatorError) {
                try Coordinator.checkPositions(report, model: model)
                return nil
            } catch { return "\(error.code.rawValue): \(error.message)" }
        }
        #expect(check(sequence, samples: 3, positions: 12) == nil && check(sequence, samples: 3, positions: 0) == nil)
        #expect(check(sequence, samples: 3, positions: nil)?.contains("carries positions") == true)
        #expect(check(sequence, samples: 3, positions: 13)?.contains("more than 3 samples of 4 positions") == true)
        #expect(check(sequence, samples: Int.max, positions: Int.max) == nil)
        // A regressor's result has no positions.
        #expect(check(ServerEvaluationTests.model, samples: 3, positions: nil) == nil)
        #expect(
            check(ServerEvaluationTests.model, samples: 3, positions: 3)?.hasPrefix("invalid_request: positions is for a model with a sequence output") == true)
        // The wire: decoded when present, refused when negative.
        let decoded = try JSONDecoder().decode(
            EvaluationReport.self, from: Data(#"{"worker_id": "w", "request_key": "k", "samples": 2, "metrics": {"loss": 1}, "positions": 7}"#.utf8))
        #expect(decoded.positions == 7 && decoded.validationFailure() == nil)
        #expect(EvaluationReport(workerID: "w", requestKey: "k", samples: 2, metrics: ["loss": 1], positions: -1).validationFailure() != nil)
    }

    @Test func noisedSumsClampCapAndReleaseNoDeviceCount() {
        let noise = EvaluationNoise(noiseMultiplier: 1e-9, maximumSamples: 10, lossBound: 2)
        var generator = SplitMix64(seed: 2)
        let evaluation = FederatedEvaluationAggregate.combine(
            [Self.result("a", 100, ["loss": 5, "accuracy": 1]), Self.result("b", 10, ["loss": 1, "accuracy": 0])], checkpoint: 1, loss: .crossEntropy,
            noise: noise, epsilon: 0.25, at: 0, using: &generator)
        // Weights capped at 10 each; a loss of 5 clamped to the bound 2.
        #expect(evaluation.devices == nil && evaluation.epsilon == 0.25 && evaluation.samples == 20)
        #expect(abs(evaluation.metrics["loss"]! - 1.5) < 1e-6 && abs(evaluation.metrics["accuracy"]! - 0.5) < 1e-6)
        #expect(Set(evaluation.metrics.keys) == ["loss", "accuracy"])
        // Real noise moves the released values, and they stay within their bounds.
        var noisy = SplitMix64(seed: 3)
        let loud = FederatedEvaluationAggregate.combine(
            [Self.result("a", 10, ["loss": 1, "mae": 0.5])], checkpoint: 1, loss: .meanSquaredError,
            noise: EvaluationNoise(noiseMultiplier: 5, maximumSamples: 10, lossBound: 2), epsilon: nil, at: 0, using: &noisy)
        #expect(loud.metrics["loss"] != 1 && (0...2).contains(loud.metrics["loss"]!) && (0...2).contains(loud.metrics["mae"]!))
        #expect(loud.metrics["rmse"] == loud.metrics["loss"]!.squareRoot())
    }

    @Test func theEvaluationsEpsilonIsTheAccountantsAtTheReducedMultiplier() throws {
        let privacy = PrivacyConfig(mode: .central, clippingNorm: 1, noiseMultiplier: 1, delta: 1e-5, population: 10_000)
        let config = FederatedEvaluationConfig(goal: 40, noise: EvaluationNoise(noiseMultiplier: 2, maximumSamples: 50, lossBound: 5))
        let epsilon = try #require(FederatedEvaluationAggregate.epsilon(releases: 30, noise: config.noise!, config: config, privacy: privacy))
        let expected = try PrivacyAccountant.epsilon(samplingRate: 50.0 / 10_000, noiseMultiplier: 2 / 3.0.squareRoot(), steps: 30, delta: 1e-5).epsilon
        #expect(epsilon == expected && epsilon > 0)
        #expect(FederatedEvaluationAggregate.epsilon(releases: 0, noise: config.noise!, config: config, privacy: privacy) == 0)
    }

    @Test func keysVerifyOnlyForTheirWorkerProcessAndShape() {
        let keys = EvaluationKeys(secret: Array(repeating: 7, count: 32))
        let key = keys.make(processID: "p1", workerID: "w_a", checkpoint: 12, expiry: 1000)
        #expect(EvaluationKeys.isEvaluationKey(key) && !EvaluationKeys.isEvaluationKey("0123abcd"))
        #expect(keys.verify(key, processID: "p1", workerID: "w_a")! == (12, 1000))
        #expect(keys.verify(key, processID: "p1", workerID: "w_b") == nil)
        #expect(keys.verify(key, processID: "p2", workerID: "w_a") == nil)
        #expect(EvaluationKeys(secret: Array(repeating: 8, count: 32)).verify(key, processID: "p1", workerID: "w_a") == nil)
        let parts = key.split(separator: ".")
        #expect(keys.verify("e.13.\(parts[2]).\(parts[3])", processID: "p1", workerID: "w_a") == nil)
        #expect(keys.verify("e.12.1001.\(parts[3])", processID: "p1", workerID: "w_a") == nil)
        // Arbitrary strings never verify (and never crash the parser).
        var generator = SplitMix64(seed: 9)
        let alphabet = Array("e.0123456789abcdef-xz ")
        for _ in 0..<2000 {
            let length = Int(generator.next() % 60)
            let text = String((0..<length).map { _ in alphabet[Int(generator.next() % UInt64(alphabet.count))] })
            #expect(keys.verify(text, processID: "p1", workerID: "w_a") == nil)
        }
    }

    @Test func tasksAreOfferedUpToTheCapacityOnceAWorkerAndFreedWhenTheyExpire() {
        let config = FederatedEvaluationConfig(every: 2, goal: 4, fraction: 0.5, reportWithin: 10)
        var tasks = EvaluationTasks()
        tasks.follow(checkpoint: 1)
        let offered1 = tasks.offer(worker: "a", now: 0, config: config, draw: 0)
        #expect(!offered1, "checkpoint 1 is not a multiple of every")
        tasks.follow(checkpoint: 2)
        let offered2 = tasks.offer(worker: "a", now: 0, config: config, draw: 0.5)
        #expect(!offered2, "a draw at or above the fraction trains")
        let offered3 = tasks.offer(worker: "a", now: 0, config: config, draw: 0.1)
        #expect(offered3)
        let offered4 = tasks.offer(worker: "a", now: 1, config: config, draw: 0.1)
        #expect(!offered4, "one task a worker")
        for worker in ["b", "c", "d", "e"] {
            let offered = tasks.offer(worker: worker, now: 1, config: config, draw: 0.1)
            #expect(offered)
        }
        #expect(config.capacity == 5)
        let offered5 = tasks.offer(worker: "f", now: 2, config: config, draw: 0.1)
        #expect(!offered5, "the goal plus its margin are out")
        tasks.stored(worker: "a", count: 1)
        let offered6 = tasks.offer(worker: "a", now: 3, config: config, draw: 0.1)
        #expect(!offered6, "a worker that sent its result gets no second task")
        let offered7 = tasks.offer(worker: "f", now: 11, config: config, draw: 0.1)
        #expect(offered7, "expired tasks free their places")
        // A worker whose own task expired (it went away) may take a new one: its stale entry does not refuse it.
        let offeredAgain = tasks.offer(worker: "b", now: 12, config: config, draw: 0.1)
        #expect(offeredAgain, "a worker's expired task does not keep it out")
        tasks.stored(worker: "f", count: 4)
        let offered8 = tasks.offer(worker: "g", now: 12, config: config, draw: 0.1)
        #expect(!offered8, "the goal is met")
        tasks.follow(checkpoint: 4)
        let offered9 = tasks.offer(worker: "a", now: 12, config: config, draw: 0.1)
        #expect(offered9, "a new checkpoint starts over")
        tasks.finalize()
        let offered10 = tasks.offer(worker: "b", now: 12, config: config, draw: 0.1)
        #expect(!offered10)
    }
}
