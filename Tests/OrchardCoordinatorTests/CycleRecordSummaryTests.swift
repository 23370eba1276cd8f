import Foundation
import OrchardCoordinator
import Testing

/// The per-cycle means the stores keep with each closed cycle, from the metrics devices sent with their reports.
@Suite struct CycleRecordSummaryTests {
    @Test func meansSkipWhatIsNotAFiniteNumber() {
        let means = CycleRecordSummary.means([
            #"{"loss": 1, "accuracy": 0.5}"#, #"{"loss": 3}"#, "{}", "", "not json", #"{"loss": "high"}"#, #"[1, 2]"#,
            #"{"loss": 1e400}"#,
        ])
        #expect(means == ["loss": 2, "accuracy": 0.5], "a report whose object has a non-number is skipped whole; 1e400 is not finite")
    }

    @Test func atMostSixteenNamesAreKeptTheFirstInNameOrder() {
        let many = "{" + (0..<20).map { "\"m\(String(format: "%02d", $0))\": \($0)" }.joined(separator: ", ") + "}"
        let means = CycleRecordSummary.means([many, #"{"m19": 1, "m00": 2}"#])
        #expect(means.count == CycleRecordSummary.maximumMetrics)
        #expect(means["m00"] == 1 && means["m15"] == 15 && means["m16"] == nil && means["m19"] == nil)
    }

    /// A buffered report carries the coordinator's `staleness` beside the device's own metrics: sixteen device names
    /// sorting before it do not crowd it out of the cycle's history.
    @Test func theCoordinatorsStalenessIsKeptBesideSixteenDeviceNames() {
        let device = (0..<16).map { "\"a\(String(format: "%02d", $0))\": 1" }.joined(separator: ", ")
        let means = CycleRecordSummary.means(["{" + device + ", \"staleness\": 2, \"zz\": 9}", #"{"staleness": 0}"#])
        #expect(means["staleness"] == 1 && means["a15"] == 1 && means["zz"] == nil && means.count == 17)
    }

    @Test func storedMeansRoundTripAndDamageReadsAsNone() {
        let means = ["loss": 0.25, "accuracy": 0.75]
        #expect(CycleRecordSummary.decode(CycleRecordSummary.json(means)) == means)
        #expect(CycleRecordSummary.json(means) == #"{"accuracy":0.75,"loss":0.25}"#)
        #expect(CycleRecordSummary.decode(nil).isEmpty && CycleRecordSummary.decode("{").isEmpty)
    }
}
