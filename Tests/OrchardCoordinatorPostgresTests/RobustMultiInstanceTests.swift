import Foundation
import OrchardCoordinator
import OrchardProtocol
import Testing

/// Robust aggregation over several instances: the instance that closes the cycle reads every instance's reports
/// from the shared store, including those of an instance that has died.
@Suite(.serialized) struct RobustMultiInstanceTests {
    typealias Group = MultiInstanceTests.Group

    @Test(arguments: StoreKind.underTest) func multiKrumCoversEveryInstancesReportsIncludingADeadOnes(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 3, foldInterval: 1) { group in
            var request = MultiInstanceTests.host(goal: 5, minimum: 5, overSelection: 1)
            request.serverConfig.robustAggregation = .multiKrum(byzantine: 1, selected: 3)
            let hosted = try await group[0].host(request)
            // Honest scales near 0.3 and two farther off; the far one claims the most samples, to no effect.
            let reports: [(scale: Float, samples: Int)] = [(0.3, 2), (0.31, 1), (40, 9), (0.29, 4), (0.5, 3)]
            var devices: [(response: AuthenticateResponse, session: DeviceSession)] = []
            var assignments: [CycleAssignment] = []
            for i in reports.indices {
                let device = try await group.device(at: i % 3)
                devices.append(device)
                assignments.append(try MultiInstanceTests.accepted(try await group.requestCycle(device, at: i % 3)))
            }
            // Instance 2 acknowledges two reports (a fold interval of 1 would have folded them under FedAvg) and dies.
            for i in [0, 2] {
                #expect(try await group.report(devices[i], assignments[i], scale: reports[i].scale, samples: reports[i].samples, at: 2).cycleClosed == false)
            }
            var closed = 0
            for i in [1, 3, 4] {
                if try await group.report(devices[i], assignments[i], scale: reports[i].scale, samples: reports[i].samples, at: i % 2).cycleClosed {
                    closed += 1
                }
            }
            #expect(closed == 1)
            // f = 1, two neighbours each: 0.29, 0.3 and 0.31 score lowest; 0.5 and 40 are left out.
            // Averaged each once: (0.3 + 0.31 + 0.29) / 3 = 0.3, whatever samples they claimed.
            let expected = MultiInstanceTests.fedAvg([(0.3, 1)])
            for instance in [0, 1] {
                await group[instance].tick()
                #expect(try await group[instance].status(processID: hosted.processID).latestCheckpoint == 1)
                MultiInstanceTests.expectClose(try await group.checkpoint(hosted.processID, at: instance), expected)
            }
        }
    }
}
