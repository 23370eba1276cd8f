import Testing
@testable import OrchardSimulation

/// The simulator's random-access draws (dropout per device, round and secure-aggregation stage; check-in jitter).
@Suite struct RandomAccessTests {
    /// How many of devices 0..<100 draw below 0.1 in `round` at `stage` (the simulator's per-stage dropout draw).
    static func drops(seed: UInt64, round: UInt64, stage: UInt64) -> Int {
        (0..<100).count { OrchardRandomAccess.uniform(seed: seed, a: UInt64($0), b: round << 3 | stage, salt: 0x5EC_A66) < 0.1 }
    }

    @Test func smallSeedsDrawDifferentFleets() {
        // Before, a seed was XOR-ed with the device index: seeds 1 and 2 only relabelled the devices, so every round
        // lost exactly as many of a 100-device fleet under either seed.
        let differing = (1...200).count { round in
            Self.drops(seed: 1, round: UInt64(round), stage: 4) != Self.drops(seed: 2, round: UInt64(round), stage: 4)
        }
        #expect(differing > 150)
    }

    @Test func drawsAreUniformAndIndependentAcrossStages() {
        // Per (device, round): the drop at one stage says nothing of the drop at the next. (A sanity check of the hash: the
        // XOR-combined draws passed it too; the seed test above is the one they fail.)
        var both = 0, third = 0, fourth = 0, sum = 0.0
        let pairs = 100 * 400
        for round in 1...400 {
            for device in 0..<100 {
                let u3 = OrchardRandomAccess.uniform(seed: 7, a: UInt64(device), b: UInt64(round) << 3 | 3, salt: 0x5EC_A66)
                let u4 = OrchardRandomAccess.uniform(seed: 7, a: UInt64(device), b: UInt64(round) << 3 | 4, salt: 0x5EC_A66)
                sum += u3
                if u3 < 0.1 { third += 1 }
                if u4 < 0.1 { fourth += 1 }
                if u3 < 0.1 && u4 < 0.1 { both += 1 }
            }
        }
        // Standard deviations: 0.0014 for the mean of 40,000 uniforms, 60 for 4,000 expected drops, 20 for 400 joint ones.
        #expect(abs(sum / Double(pairs) - 0.5) < 0.006)
        #expect(abs(third - pairs / 10) < 250 && abs(fourth - pairs / 10) < 250)
        #expect(abs(both - pairs / 100) < 80)
    }
}
