import Foundation
import OrchardCoordinator
import OrchardCoordinatorPostgres
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Synchronization
import Testing

/// Reports committed folded into their instance's partial sum (``FoldingStore``), as PostgreSQL takes them: the store's
/// contract, and a coordinator's reports folded in batches, then a restart that goes on from the stored sum.
@Suite(TestDatabase.requirement)
struct FoldedReportsTests {
    typealias F = ContractFixture

    /// A partial sum whose bytes and weight name the reports `fold` was given, so a test can tell which call wrote it.
    static func sum(_ accepted: [Int], reports: Int) -> StoredPartialSum {
        StoredPartialSum(bytes: accepted.flatMap { Array(repeating: UInt8($0), count: 8) }, weight: Double(accepted.count), reports: reports, unclipped: 0)
    }

    static func withFoldingStores(_ body: (any FoldingStore, any CoordinatorStore) async throws -> Void) async throws {
        try await withStores(.postgres) { stores in
            guard let main = stores.main as? any FoldingStore else { throw MultiInstanceTests.HarnessFailure("PostgreSQL does not fold reports") }
            try await body(main, stores.peer)
        }
    }

    @Test func aBatchIsCommittedWithItsSumAndForgetsTheDiffsTheSumNowHolds() async throws {
        try await Self.withFoldingStores { main, peer in
            try await F.host(main)
            try await F.assign(main, 0..<4)
            // w3's diff was stored whole before (a report this instance summed at its last load).
            try await main.recordReport(F.report(3, instance: "a"), bytes: F.diff(3))
            let (outcomes, reported) = try await main.recordFoldedReports(
                [F.report(0, instance: "a"), F.report(1, instance: "a")], base: 0, forgetting: ["w3"]
            ) { accepted in Self.sum(accepted, reports: 1 + accepted.count) }
            #expect(outcomes.allSatisfy { (try? $0.get()) != nil })
            #expect(reported == 3)
            let open = try #require(try await peer.openCycle(processID: "p"))
            #expect(open.partialSums["a"] == Self.sum([0, 1], reports: 3))
            #expect(Set(open.assignments.filter(\.reported).map(\.workerID)) == ["w0", "w1", "w3"])
            #expect(open.assignments.filter(\.reported).allSatisfy { $0.instance == "a" })
            #expect(try await PendingCollector.pending(peer).isEmpty, "w3's diff is in the sum now; w0's and w1's were never stored")
        }
    }

    @Test func aReportedKeyIsRefusedAndTheRestCommittedWithoutIt() async throws {
        try await Self.withFoldingStores { main, peer in
            try await F.host(main)
            try await F.assign(main, 0..<3)
            _ = try await main.recordFoldedReports([F.report(1, instance: "a")], base: 0, forgetting: []) { Self.sum($0, reports: $0.count) }
            let calls = Mutex<[[Int]]>([])
            let (outcomes, reported) = try await main.recordFoldedReports(
                [F.report(0, instance: "a"), F.report(1, instance: "a"), F.report(2, instance: "a")], base: 1, forgetting: []
            ) { accepted in
                calls.withLock { $0.append(accepted) }
                return Self.sum(accepted, reports: 1 + accepted.count)
            }
            #expect(calls.withLock { $0 } == [[0, 1, 2], [0, 2]], "the sum is built again without the refused report")
            #expect((try? outcomes[0].get()) != nil && (try? outcomes[2].get()) != nil)
            #expect(throws: StoreError.self) { try outcomes[1].get() }
            if case .failure(let error) = outcomes[1] { #expect(error.code == .duplicate) }
            #expect(reported == 3)
            #expect(try await peer.openCycle(processID: "p")?.partialSums["a"] == Self.sum([0, 2], reports: 3))
        }
    }

    @Test func aSumBuiltOnAnotherBaseOrASealedCycleWritesNothing() async throws {
        try await Self.withFoldingStores { main, peer in
            try await F.host(main)
            try await F.assign(main, 0..<2)
            let stale = try await storeErrorCode {
                _ = try await main.recordFoldedReports([F.report(0, instance: "a")], base: 4, forgetting: []) { Self.sum($0, reports: 5) }
            }
            #expect(stale == .corrupt)
            #expect(try await main.sealCycle(processID: "p", cycle: 1, at: F.epoch))
            let sealed = try await storeErrorCode {
                _ = try await main.recordFoldedReports([F.report(1, instance: "a")], base: 0, forgetting: []) { Self.sum($0, reports: 1) }
            }
            #expect(sealed == .cycleClosed)
            let open = try #require(try await peer.openCycle(processID: "p"))
            #expect(open.partialSums.isEmpty)
            #expect(open.assignments.filter(\.reported).isEmpty)
        }
    }

    @Test func aBufferCommitsOnlyUpToItsReleaseLimit() async throws {
        try await Self.withFoldingStores { main, _ in
            try await F.host(main)
            try await F.assign(main, 0..<4)
            func limited(_ i: Int) -> ReportRecord {
                var report = F.report(i, instance: "a")
                report.releaseLimit = 3
                report.staleness = i
                return report
            }
            _ = try await main.recordFoldedReports([limited(0)], base: 0, forgetting: []) { Self.sum($0, reports: $0.count) }
            let (outcomes, reported) = try await main.recordFoldedReports([limited(1), limited(2), limited(3)], base: 1, forgetting: []) {
                Self.sum($0, reports: 1 + $0.count)
            }
            #expect((try? outcomes[0].get()) != nil && (try? outcomes[1].get()) != nil)
            if case .failure(let error) = outcomes[2] { #expect(error.code == .cycleClosed) } else { Issue.record("the fourth report went past the limit") }
            #expect(reported == 3)
            let open = try #require(try await main.openCycle(processID: "p"))
            #expect(open.assignments.filter(\.reported).map(\.staleness).sorted { ($0 ?? -1) < ($1 ?? -1) } == [0, 1, 2])
        }
    }

    /// Reports at one instance arriving together are committed into its partial sum (none left as a stored diff, which
    /// the fold interval of 100 would otherwise keep); a coordinator restarted as that instance goes on from the
    /// stored sum, and the checkpoint is FedAvg of every report.
    @Test func reportsFoldedAtOneInstanceSurviveItsRestartAndAverageOnce() async throws {
        try await MultiInstanceTests.Group.with(.postgres, instances: 1, foldInterval: 100) { group in
            let hosted = try await group[0].host(MultiInstanceTests.host(goal: 8))
            let scales: [Float] = [0.5, -1, 2, 0.25, 1.5, -0.75, 3, -2]
            let samples = [3, 7, 2, 5, 11, 4, 1, 6]
            var devices: [(response: AuthenticateResponse, session: DeviceSession)] = []
            var assignments: [CycleAssignment] = []
            for _ in 0..<8 {
                let device = try await group.device(at: 0)
                devices.append(device)
                assignments.append(try MultiInstanceTests.accepted(try await group.requestCycle(device, at: 0)))
            }
            let (snapshotDevices, snapshotAssignments) = (devices, assignments)
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                for i in 0..<6 {
                    tasks.addTask {
                        let response = try await group.report(snapshotDevices[i], snapshotAssignments[i], scale: scales[i], samples: samples[i], at: 0)
                        #expect(!response.cycleClosed)
                    }
                }
                try await tasks.waitForAll()
            }
            #expect(try await PendingCollector.pending(group.store, processID: hosted.processID).isEmpty)
            #expect(try await group.store.openCycle(processID: hosted.processID)?.partialSums["instance-0"]?.reports == 6)
            // The instance restarts: a new coordinator under the same instance ID over the same database.
            let restarted = Coordinator(
                store: group.store, configuration: CoordinatorConfiguration(adminToken: "admin", foldInterval: 100, instanceID: "instance-0"),
                clock: group.clock, random: SplitMix64(seed: 9))
            try await restarted.start()
            var closed = false
            for i in 6..<8 {
                let body = ReportEnvelope.encode(
                    diff: MultiInstanceTests.diff(scales[i]),
                    metadata: ReportMetadata(workerID: devices[i].response.workerID, requestKey: assignments[i].requestKey, sampleCount: samples[i]))
                let response = try await restarted.report(body, session: try await restarted.session(forToken: devices[i].response.sessionToken))
                closed = closed || response.cycleClosed
            }
            #expect(closed, "the eighth report meets the goal of eight")
            let (_, bytes) = try await restarted.checkpoint(processID: hosted.processID, number: nil)
            MultiInstanceTests.expectClose(
                try Safetensors.decode(bytes).byName.mapValues(\.values),
                MultiInstanceTests.fedAvg(Array(zip(scales, samples)).map { (scale: $0.0, samples: $0.1) }))
        }
    }
}
