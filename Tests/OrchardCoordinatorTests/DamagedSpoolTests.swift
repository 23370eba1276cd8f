import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import OrchardTesting
import Testing

/// A power loss under `normal` durability (spool files not synced) can leave a committed report's diff file missing or
/// short. The coordinator still starts: it discards that report, loudly, and the cycle goes on with the others.
@Suite(.serialized) struct DamagedSpoolTests {
    /// Every spooled diff file of the harness's database.
    static func spoolFiles(_ harness: Harness) -> [URL] {
        let root = URL(fileURLWithPath: harness.databasePath + "-spool")
        let walker = FileManager.default.enumerator(at: root, includingPropertiesForKeys: [.isRegularFileKey])
        return (walker?.allObjects as? [URL] ?? []).filter { (try? $0.resourceValues(forKeys: [.isRegularFileKey]).isRegularFile) == true }
            .sorted { $0.path < $1.path }
    }

    @Test(arguments: [("missing", false), ("short", false), ("missing", true)])
    func aReportWhoseDiffCannotBeReadBackIsDiscardedAndTheCoordinatorStarts(_ damage: String, robust: Bool) async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Fixture.host(goal: 3)
            // A robust rule reads the reports back when the cycle closes: a damaged one is discarded at start-up too.
            if robust { request.serverConfig.robustAggregation = RobustAggregationConfig(rule: .median) }
            let hosted = try await harness.host(request)
            let first = try await harness.device(), second = try await harness.device()
            let a1 = try await harness.join(first), a2 = try await harness.join(second)
            #expect(try await harness.report(first, a1, diff: Fixture.diff(1), samples: 2).status == 200)
            let before = Set(Self.spoolFiles(harness))
            #expect(try await harness.report(second, a2, diff: Fixture.diff(-3), samples: 5).status == 200)
            // The second report's file, damaged as a power loss would leave it.
            let file = try #require(Set(Self.spoolFiles(harness)).subtracting(before).first)
            if damage == "missing" {
                try FileManager.default.removeItem(at: file)
            } else {
                try Data(try Data(contentsOf: file).prefix(7)).write(to: file)
            }
            try await harness.restart()
            // Started: the damaged report no longer counts, the other does; its file is gone.
            let status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.reported == 1, "\(String(describing: status.currentCycle))")
            #expect(!FileManager.default.fileExists(atPath: file.path))
            // Two more reports reach the goal of three: the checkpoint is the mean of the three that count.
            let third = try await harness.device(), fourth = try await harness.device()
            let a3 = try await harness.join(third), a4 = try await harness.join(fourth)
            #expect(try await harness.report(third, a3, diff: Fixture.diff(0.5), samples: 1).status == 200)
            #expect(try await harness.report(fourth, a4, diff: Fixture.diff(2), samples: 4).status == 200)
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            if robust { return }
            let checkpoint = try await harness.http.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: Harness.adminToken)
            let weights = try Safetensors.decode(checkpoint.body).byName.mapValues(\.values)
            let expected = Fixture.expectedAfterFedAvg([(1, 2), (0.5, 1), (2, 4)])
            for (name, values) in expected {
                #expect(zip(weights[name] ?? [], values).allSatisfy { abs($0 - $1) < 1e-5 }, "\(name)")
            }
        }
    }
}
