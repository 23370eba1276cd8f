import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

/// A result that is not finite is never published.
@Suite(.serialized) struct NonFiniteAggregateTests {
    @Test func anOverflowingFedAvgStepAbandonsTheCycleAndKeepsTheCheckpoint() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            // Every value finite (at most 2e38), but η = 4 takes the step past Float's range.
            let hosted = try await harness.host(hostRequest(aggregator: AggregatorConfig(kind: .fedAvg, serverLearningRate: 4)))
            let device = try await harness.device()
            let first = try await harness.join(device)
            #expect(try await harness.report(device, first, diff: Fixture.diff(5e37), samples: 10).status == 200)

            let status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 0)
            #expect(status.checkpoints == [0])
            #expect(status.cyclesAbandoned == 1 && status.cyclesCompleted == 0)
            #expect(status.currentCycle?.number == 2 && status.currentCycle?.checkpoint == 0)
            expectClose(try await harness.checkpoint(hosted.processID), initialWeights(), tolerance: 0)
            let metrics = String(decoding: try await harness.http.send("GET", Endpoint.metrics).body, as: UTF8.self)
            #expect(metrics.contains(#"orchard_cycles_abandoned_total{reason="non_finite"} 1"#), "\(metrics)")

            // The next cycle opens from checkpoint 0 and aggregates normally: x₁ = x₀ + 4 · 0.1 (i + 1).
            let second = try await harness.join(device)
            #expect(second.modelID.hasSuffix(".0"))
            #expect(try await harness.report(device, second, diff: Fixture.diff(0.1), samples: 10).status == 200)
            var expected = initialWeights()
            for (name, values) in expected where !name.hasPrefix("embed.") {
                expected[name] = values.indices.map { values[$0] + 4 * 0.1 * Float($0 + 1) }
            }
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(try await harness.checkpoint(hosted.processID), expected)
        }
    }

    @Test func anOverflowingFedAdamStateIsNotPersisted() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let aggregator = AggregatorConfig(kind: .fedAdam, serverLearningRate: 0.1, beta1: 0.9, beta2: 0.99, tau: 0.01)
            let hosted = try await harness.host(hostRequest(aggregator: aggregator))
            let device = try await harness.device()
            let first = try await harness.join(device)
            // d² = 1e40 overflows v to infinity; the weights themselves would stay finite (m / √v = 0).
            #expect(try await harness.report(device, first, diff: Fixture.diff(1e20), samples: 7).status == 200)
            let status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 0 && status.cyclesAbandoned == 1)
            expectClose(try await harness.checkpoint(hosted.processID), initialWeights(), tolerance: 0)

            // After a restart (the state as stored) the next cycle steps from a fresh state, as if cycle 1 never was.
            try await harness.restart()
            let second = try await harness.join(device)
            #expect(try await harness.report(device, second, diff: Fixture.diff(0.2), samples: 7).status == 200)
            let weights = try await harness.checkpoint(hosted.processID)
            let d = 0.2, m = 0.1 * d, v = 0.99 * 1e-4 + 0.01 * d * d
            #expect(abs(Double(weights["out.bias"]![0]) - 0.1 * m / (v.squareRoot() + 0.01)) < 1e-5)
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
        }
    }
}
