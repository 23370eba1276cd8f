import Foundation
@testable import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

/// A report counted once when the process is reloaded from the store between the report's commit and its count in
/// memory (a reload rebuilds the running sum from the committed diffs, this one's among them).
@Suite struct ReloadDuringReportTests {
    @Test func aReportCommittedAcrossAReloadIsSummedOnce() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 2, minimum: 2, overSelection: 1))
            let first = try await harness.device(), second = try await harness.device()
            let (a, b) = (try await harness.join(first), try await harness.join(second))
            let coordinator = harness.coordinator
            await coordinator.setReportRecordedHook { processID in _ = await coordinator.reload(processID: processID) }
            #expect(try await harness.report(first, a, diff: Fixture.diff(0.5), samples: 3).status == 200)
            await coordinator.setReportRecordedHook(nil)
            #expect(try await harness.report(second, b, diff: Fixture.diff(-0.25), samples: 1).status == 200)
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([(0.5, 3), (-0.25, 1)]))
        }
    }

    /// The same, with a fold between the reload and the count: the fold takes the reloaded report out of the unfolded
    /// list, and the report must still be found summed (it was counted twice before).
    @Test func aReportCommittedAcrossAReloadAndAFoldIsSummedOnce() async throws {
        var configuration = CoordinatorConfiguration(adminToken: Harness.adminToken)
        configuration.foldInterval = 1
        let harness = try await Harness.start(configuration: configuration)
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 3, minimum: 3, overSelection: 1))
            let first = try await harness.device(), second = try await harness.device(), third = try await harness.device()
            let (a, b, c) = (try await harness.join(first), try await harness.join(second), try await harness.join(third))
            let coordinator = harness.coordinator
            let secondBody = ReportEnvelope.encode(
                diff: Fixture.diff(-0.25), metadata: ReportMetadata(workerID: second.workerID, requestKey: b.requestKey, sampleCount: 1))
            let secondSession = try await coordinator.session(forToken: second.sessionToken)
            await coordinator.setReportRecordedHook { processID in
                await coordinator.setReportRecordedHook(nil)
                _ = await coordinator.reload(processID: processID)
                // Another report, counted (and folded, with the reloaded one) before the first is counted.
                _ = try? await coordinator.report(secondBody, session: secondSession)
            }
            #expect(try await harness.report(first, a, diff: Fixture.diff(0.5), samples: 3).status == 200)
            #expect(try await harness.report(third, c, diff: Fixture.diff(0.125), samples: 2).status == 200)
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg([(0.5, 3), (-0.25, 1), (0.125, 2)]))
        }
    }
}
