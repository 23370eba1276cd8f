import OrchardSupport
import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

@Suite(.serialized) struct CoordinatorHTTPTests {
    @Test func fullCycleWithSeveralDevices() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 3, overSelection: 1.3))
            #expect(hosted.currentCycle?.capacity == 4)

            var devices: [AuthenticateResponse] = []
            var assignments: [CycleAssignment] = []
            for _ in 0..<4 {
                let device = try await harness.device()
                devices.append(device)
                assignments.append(try await harness.join(device))
            }
            #expect(Set(assignments.map(\.requestKey)).count == 4)

            // Over capacity: rejected with a numeric retry_after.
            let fifth = try await harness.device()
            let rejection = try await harness.http.json(
                "POST", Endpoint.cycleRequest, CycleRequest(workerID: fifth.workerID, processName: "tiny", processVersion: SemanticVersion(1)),
                token: fifth.sessionToken)
            let object = try JSONSerialization.jsonObject(with: Data(rejection.body)) as? [String: Any]
            #expect(object?["status"] as? String == "rejected")
            #expect(object?["retry_after"] is NSNumber)
            #expect(((object?["retry_after"] as? NSNumber)?.doubleValue ?? 0) >= 600)

            // Download model (whole, then resumed with Range) and plan.
            let modelPath = Endpoint.model(assignments[0].modelID) + "?request_key=\(assignments[0].requestKey)"
            let whole = try await harness.http.send("GET", modelPath, token: devices[0].sessionToken)
            #expect(whole.status == 200)
            let etag = try #require(whole.header("ETag"))
            #expect(try Safetensors.decode(whole.body).byName["out.weight"]?.values == [0.5, -0.5, 0.25, 1])
            let head = try await harness.http.send("GET", modelPath, token: devices[0].sessionToken, headers: ["Range": "bytes=0-99"])
            #expect(head.status == 206)
            #expect(head.body.count == 100)
            let tail = try await harness.http.send("GET", modelPath, token: devices[0].sessionToken, headers: ["Range": "bytes=100-", "If-Range": etag])
            #expect(tail.status == 206)
            #expect(tail.header("Content-Range") == "bytes 100-\(whole.body.count - 1)/\(whole.body.count)")
            #expect(head.body + tail.body == whole.body)
            let notModified = try await harness.http.send("GET", modelPath, token: devices[0].sessionToken, headers: ["If-None-Match": etag])
            #expect(notModified.status == 304)
            let unsatisfiable = try await harness.http.send("GET", modelPath, token: devices[0].sessionToken, headers: ["Range": "bytes=\(whole.body.count)-"])
            #expect(unsatisfiable.status == 416)
            let plan = try await harness.http.send(
                "GET", Endpoint.plan(assignments[0].planID) + "?request_key=\(assignments[0].requestKey)", token: devices[0].sessionToken
            ).decode(TrainingPlan.self)
            #expect(plan.model == Fixture.model)
            #expect(plan.clientConfig.batchSize == 4)
            #expect(plan.clientConfig.extra["note"] == .string("test"))

            // Three reports reach the goal and close the cycle.
            let reports: [(scale: Float, samples: Int)] = [(0.1, 10), (-0.2, 30), (0.4, 60)]
            for (index, report) in reports.enumerated() {
                let result = try await harness.report(devices[index], assignments[index], diff: Fixture.diff(report.scale), samples: report.samples)
                #expect(result.status == 200, "\(String(decoding: result.body, as: UTF8.self))")
                let response = try result.decode(ReportResponse.self)
                #expect(response.reportsReceived == index + 1)
                // Only the report that reaches the goal closes the cycle, and says so.
                #expect(response.cycleClosed == (index == reports.count - 1))
            }
            let status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 1)
            #expect(status.cyclesCompleted == 1)
            #expect(status.currentCycle?.number == 2)
            #expect(status.currentCycle?.checkpoint == 1)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(reports))

            // The fourth device reports too late.
            let late = try await harness.report(devices[3], assignments[3], diff: Fixture.diff(1), samples: 5)
            #expect(late.status == 409)
            #expect(late.errorCode == "deadline_passed")

            // Checkpoint 0 is still downloadable; the model id of cycle 2 names checkpoint 1.
            expectClose(try await harness.checkpoint(hosted.processID, "0"), Dictionary(uniqueKeysWithValues: Fixture.weights.map { ($0.name, $0.values) }))
            let next = try await harness.join(devices[0])
            #expect(next.modelID.hasSuffix(".1"))

            let metrics = try await harness.http.send("GET", Endpoint.metrics)
            #expect(String(decoding: metrics.body, as: UTF8.self).contains("orchard_reports_total"))
            #expect(try await harness.http.send("GET", Endpoint.health).status == 200)
        }
    }

    @Test func deadlineClosesTheCycleWithWhatArrived() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 5, minimum: 2, cycleLength: 60))
            var reports: [(scale: Float, samples: Int)] = []
            for (i, scale) in [Float(0.3), -0.1].enumerated() {
                let device = try await harness.device()
                let assignment = try await harness.join(device)
                #expect(try await harness.report(device, assignment, diff: Fixture.diff(scale), samples: i + 1).status == 200)
                reports.append((scale, i + 1))
            }
            harness.clock.advance(bySeconds: 59)
            await harness.coordinator.tick()
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 0)
            harness.clock.advance(bySeconds: 1)
            await harness.coordinator.tick()
            let status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 1)
            #expect(status.currentCycle?.number == 2)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(reports))
        }
    }

    @Test func tooFewReportsAbandonTheCycleAndReopenIt() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 5, minimum: 2, cycleLength: 60))
            let device = try await harness.device()
            let assignment = try await harness.join(device)
            #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.5), samples: 3).status == 200)
            harness.clock.advance(bySeconds: 61)
            await harness.coordinator.tick()
            let status = try await harness.status(hosted.processID)
            #expect(status.cyclesAbandoned == 1)
            #expect(status.latestCheckpoint == 0)
            #expect(status.currentCycle?.number == 2)
            #expect(status.currentCycle?.reported == 0)
            expectClose(try await harness.checkpoint(hosted.processID), Dictionary(uniqueKeysWithValues: Fixture.weights.map { ($0.name, $0.values) }))
            // The device can join the reopened cycle.
            let again = try await harness.join(device)
            #expect(again.cycle == 2 && again.checkpoint == 0)
        }
    }

    @Test func orderlyRestartResumesTheOpenCycleWithoutLosingOrDoubleCounting() async throws {
        let harness = try await Harness.start(configuration: CoordinatorConfiguration(adminToken: Harness.adminToken, foldInterval: 2))
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 4, minimum: 1))
            var devices: [(AuthenticateResponse, CycleAssignment)] = []
            for _ in 0..<4 {
                let device = try await harness.device()
                devices.append((device, try await harness.join(device)))
            }
            let reports: [(scale: Float, samples: Int)] = [(0.1, 1), (0.2, 2), (0.3, 3), (0.4, 4)]
            for i in 0..<3 {
                #expect(try await harness.report(devices[i].0, devices[i].1, diff: Fixture.diff(reports[i].scale), samples: reports[i].samples).status == 200)
            }
            try await harness.restart()
            #expect(try await harness.status(hosted.processID).currentCycle?.reported == 3)
            let duplicate = try await harness.report(devices[0].0, devices[0].1, diff: Fixture.diff(9), samples: 100)
            #expect(duplicate.status == 409)
            #expect(duplicate.errorCode == "report_already_received")
            #expect(try await harness.report(devices[3].0, devices[3].1, diff: Fixture.diff(reports[3].scale), samples: reports[3].samples).status == 200)
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(reports))
        }
    }

    @Test func checkpointsArePrunedByRetentionAndProcessesCompleteAndDelete() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 1, minimum: 1, overSelection: 1, cycles: 3))
            let device = try await harness.device()
            for _ in 0..<3 {
                let assignment = try await harness.join(device)
                #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.1), samples: 1).status == 200)
            }
            let status = try await harness.status(hosted.processID)
            #expect(status.state == .completed)
            #expect(status.checkpoints == [2, 3])
            #expect(status.currentCycle == nil)
            guard case .rejected(let rejection) = try await harness.requestCycle(device) else {
                Issue.record("completed process admitted a device")
                return
            }
            #expect(rejection.reason == "process_completed")
            let pruned = try await harness.http.send("GET", Endpoint.checkpoint(hosted.processID, "0"), token: Harness.adminToken)
            #expect(pruned.status == 404)
            #expect(try await harness.http.send("GET", Endpoint.processes, token: Harness.adminToken).decode(ProcessList.self).processes.count == 1)
            #expect(try await harness.http.send("DELETE", Endpoint.process(hosted.processID), token: Harness.adminToken).status == 204)
            #expect(try await harness.http.send("GET", Endpoint.process(hosted.processID), token: Harness.adminToken).status == 404)
        }
    }

    @Test func fedAdamServerOptimizerIsApplied() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let aggregator = AggregatorConfig(kind: .fedAdam, serverLearningRate: 0.1, beta1: 0.9, beta2: 0.99, tau: 0.01)
            let hosted = try await harness.host(Fixture.host(goal: 1, minimum: 1, overSelection: 1, aggregator: aggregator))
            let device = try await harness.device()
            let assignment = try await harness.join(device)
            #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.2), samples: 7).status == 200)
            let weights = try await harness.checkpoint(hosted.processID)
            // out.bias[0]: d = 0.2 · 1; m = 0.1 d; v = 0.99 τ² + 0.01 d²; x += η m / (√v + τ).
            let d = 0.2, m = 0.1 * d, v = 0.99 * 1e-4 + 0.01 * d * d
            #expect(abs(Double(weights["out.bias"]![0]) - 0.1 * m / (v.squareRoot() + 0.01)) < 1e-5)
            #expect(weights["embed.weight"] == [1, 2, 3, 4, 5, 6])
        }
    }

    @Test func versionSpellingsNameTheSameProcess() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host()
            let device = try await harness.device(version: "1")
            guard case .accepted = try await harness.requestCycle(device, version: "1.0.0") else {
                Issue.record("1.0.0 did not match the process hosted as 1.0")
                return
            }
            let duplicate = try await harness.http.json("POST", Endpoint.processes, Fixture.host(), token: Harness.adminToken)
            #expect(duplicate.status == 409)
            #expect(duplicate.errorCode == "process_exists")
        }
    }

    @Test func openAPIDocumentListsEveryRoute() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let result = try await harness.http.send("GET", Endpoint.openAPI)
            let document = try #require(try JSONSerialization.jsonObject(with: Data(result.body)) as? [String: Any])
            #expect((document["openapi"] as? String)?.hasPrefix("3.") == true)
            let paths = try #require(document["paths"] as? [String: Any])
            for path in [
                Endpoint.health, Endpoint.metrics, Endpoint.openAPI, Endpoint.authenticate, Endpoint.cycleRequest, "/v1/device/models/{model_id}",
                "/v1/device/plans/{plan_id}", Endpoint.report, Endpoint.speedTest, Endpoint.processes, "/v1/admin/processes/{process_id}",
                "/v1/admin/processes/{process_id}/checkpoints/{checkpoint}",
            ] {
                #expect(paths[path] != nil, "\(path) missing from openapi.json")
            }
        }
    }
}
