import Foundation
import OrchardPrivacy
import OrchardSupport
import Testing

/// Masks expanded ahead of the delivery give the same masked input as masks expanded with it, also when a neighbour
/// dropped at share_keys (its pairwise mask is taken back out).
@Suite struct SecureAggregationPrecomputeTests {
    @Test(arguments: [Set<Int>(), [3]])
    func precomputedMasksGiveTheSameMaskedInput(droppedAtShareKeys: Set<Int>) throws {
        var cycle = try SecureAggregationStageTests.Cycle()
        try cycle.advertise()
        #expect(try cycle.devices[0].maskPlan() == nil, "no plan before the shares are sent")
        try cycle.share(skipping: droppedAtShareKeys)
        let update = (0..<SecureAggregationStageTests.length).map { Float($0) / 20 - 0.3 }
        for case .deliverShares(let device, let delivery) in cycle.actions {
            let plan = try #require(try cycle.devices[device - 1].maskPlan())
            var direct = cycle.devices[device - 1], ahead = cycle.devices[device - 1]
            var first = SplitMix64(seed: UInt64(device)), second = SplitMix64(seed: UInt64(device))
            let expected = try direct.maskedInput(delivery, update: update, sampleCount: device, using: &first)
            let masked = try ahead.maskedInput(delivery, update: update, sampleCount: device, precomputed: try plan.compute(), using: &second)
            #expect(masked == expected, "device \(device)")
            #expect(try ahead.maskPlan() == nil, "no plan after the masked input")
        }
        // A plan of another device is ignored, not trusted.
        guard case .deliverShares(let device, let delivery)? = cycle.actions.first(where: { if case .deliverShares = $0 { true } else { false } }) else {
            Issue.record("no delivery")
            return
        }
        let other = try #require(try cycle.devices[device == 1 ? 1 : 0].maskPlan())
        var direct = cycle.devices[device - 1], ahead = cycle.devices[device - 1]
        var first = SplitMix64(seed: 9), second = SplitMix64(seed: 9)
        let expected = try direct.maskedInput(delivery, update: update, sampleCount: 1, using: &first)
        #expect(try ahead.maskedInput(delivery, update: update, sampleCount: 1, precomputed: try other.compute(), using: &second) == expected)
    }
}
