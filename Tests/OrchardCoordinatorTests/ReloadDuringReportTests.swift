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
}
