import Foundation
import OrchardSimulation
import Testing

/// A shard's `metrics.jsonl` row speaks of cycles and keeps the key scripts already read (`round`).
@Suite struct ShardCycleMetricsTests {
    static let row = ShardCycleMetrics(
        cycle: 7, aggregated: true, checkpoint: 5, cyclesCompleted: 5, cyclesAbandoned: 2, wallSeconds: 1.5, checkIns: 10,
        admitted: 8, rejected: 2, reported: 7, dropped: 1, late: 0, failed: 0, testLoss: 0.25
    )

    @Test func writesCycleUnderBothKeys() throws {
        let object = try #require(JSONSerialization.jsonObject(with: JSONEncoder().encode(Self.row)) as? [String: Any])
        #expect(object["cycle"] as? Int == 7)
        #expect(object["round"] as? Int == 7)
        #expect(object["test_loss"] as? Double == 0.25)
        #expect(object["test_accuracy"] == nil)
    }

    @Test func readsItsOwnRowsAndOldRows() throws {
        #expect(try JSONDecoder().decode(ShardCycleMetrics.self, from: JSONEncoder().encode(Self.row)) == Self.row)
        // A row written before the rename has only `round`.
        let old =
            #"{"round":7,"aggregated":true,"checkpoint":5,"cycles_completed":5,"cycles_abandoned":2,"wall_seconds":1.5,"check_ins":10,"admitted":8,"rejected":2,"reported":7,"dropped":1,"late":0,"failed":0,"test_loss":0.25}"#
        #expect(try JSONDecoder().decode(ShardCycleMetrics.self, from: Data(old.utf8)) == Self.row)
        // Neither key: an error naming what is missing.
        let neither = old.replacingOccurrences(of: #""round":7,"#, with: "")
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(ShardCycleMetrics.self, from: Data(neither.utf8)) }
    }
}
