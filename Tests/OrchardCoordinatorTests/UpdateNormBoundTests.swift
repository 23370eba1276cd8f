import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

/// The trainable values of ``Fixture/diff(_:)`` are `scale × (i + 1)` over out.weight (4) and out.bias (2).
let fixtureUnitNorm = (1.0 + 4 + 9 + 16 + 1 + 4).squareRoot()

func initialWeights() -> [String: [Float]] {
    Dictionary(uniqueKeysWithValues: Fixture.weights.map { ($0.name, $0.values) })
}

func hostRequest(goal: Int = 1, aggregator: AggregatorConfig = AggregatorConfig(), bound: Double? = nil, policy: UpdateNormPolicy = .clip) -> HostProcessRequest
{
    var request = Fixture.host(goal: goal, minimum: goal, overSelection: 1, aggregator: aggregator)
    request.serverConfig.updateNormBound = bound
    request.serverConfig.updateNormPolicy = policy
    return request
}

/// update_norm_bound / update_norm_policy over loopback HTTP.
@Suite(.serialized) struct UpdateNormBoundTests {
    @Test func clipScalesTheDiffToTheBoundBeforeItIsFolded() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(hostRequest(goal: 2, bound: 2))
            #expect(hosted.serverConfig.updateNormBound == 2)
            #expect(hosted.serverConfig.updateNormPolicy == .clip)
            let big = try await harness.device(), small = try await harness.device()
            let bigAssignment = try await harness.join(big), smallAssignment = try await harness.join(small)
            // Norm √35 ≈ 5.92 > 2: clipped to 2. Norm 0.1 √35 ≈ 0.59: kept.
            #expect(try await harness.report(big, bigAssignment, diff: Fixture.diff(1), samples: 3).status == 200)
            #expect(try await harness.report(small, smallAssignment, diff: Fixture.diff(0.1), samples: 5).status == 200)
            let status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 1)
            let clippedScale = Float(2 / fixtureUnitNorm)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([(clippedScale, 3), (0.1, 5)]), tolerance: 1e-6)
        }
    }

    @Test func rejectRefusesWithUpdateNormExceededAndTheDeviceMayReportAgain() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(hostRequest(bound: 1, policy: .reject))
            let device = try await harness.device()
            let assignment = try await harness.join(device)
            let refused = try await harness.report(device, assignment, diff: Fixture.diff(1), samples: 3)
            #expect(refused.status == 422)
            #expect(refused.errorCode == "update_norm_exceeded")
            let message = try refused.decode(ErrorBody.self).error.message
            #expect(message.contains("5.91") && message.contains("update_norm_bound 1.0"), "\(message)")
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 0)
            expectClose(try await harness.checkpoint(hosted.processID), initialWeights())
            // Within the bound: accepted, and folded unchanged.
            #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.1), samples: 3).status == 200)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([(0.1, 3)]))
        }
    }

    @Test func anUnsetBoundKeepsEveryFiniteDiff() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(hostRequest())
            #expect(hosted.serverConfig.updateNormBound == nil)
            let device = try await harness.device()
            let assignment = try await harness.join(device)
            #expect(try await harness.report(device, assignment, diff: Fixture.diff(1000), samples: 1_000_000).status == 200)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([(1000, 1_000_000)]), tolerance: 1e-2)
        }
    }

    @Test func theBoundMustBePositiveAndFiniteAndThePolicyKnown() async throws {
        for bound in [0, -1, Double.nan, Double.infinity] {
            var config = ServerConfig()
            config.updateNormBound = bound
            #expect(config.validationFailure()?.contains("update_norm_bound") == true, "\(bound)")
        }
        #expect(ServerConfig(updateNormBound: 0.5).validationFailure() == nil)

        let harness = try await Harness.start()
        try await harness.stopping {
            for bound in [0.0, -3] {
                let result = try await harness.http.json("POST", Endpoint.processes, hostRequest(bound: bound), token: Harness.adminToken)
                #expect(result.status == 400)
                #expect(result.errorCode == "invalid_configuration")
            }
            var json = try #require(try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(hostRequest(bound: 1))) as? [String: Any])
            var server = try #require(json["server_config"] as? [String: Any])
            server["update_norm_policy"] = "squash"
            json["server_config"] = server
            let unknownPolicy = try await harness.http.send(
                "POST", Endpoint.processes, body: Array(try JSONSerialization.data(withJSONObject: json)), token: Harness.adminToken)
            #expect(unknownPolicy.status == 400)
            #expect(unknownPolicy.errorCode == "invalid_configuration")
            #expect(try unknownPolicy.decode(ErrorBody.self).error.message.contains("squash"))
            #expect(try await harness.http.send("GET", Endpoint.processes, token: Harness.adminToken).decode(ProcessList.self).processes.isEmpty)
        }
    }
}
