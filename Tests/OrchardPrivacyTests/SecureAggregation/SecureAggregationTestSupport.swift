import Foundation
import OrchardPrivacy
import OrchardSupport

/// Shared inputs of the secure-aggregation tests.
enum SecAggFixture {
    static let context = "task-7/cycle-3"
    static let maximumSampleCount = 100

    /// Random updates in ±1.5 (some beyond the clipping range 1) and sample counts 1…100, for devices 1…n.
    static func inputs(devices n: Int, length: Int, seed: UInt64) -> [Int: SecureAggregationCycle.Input] {
        var generator = OrchardRandom(seed: seed)
        var inputs: [Int: SecureAggregationCycle.Input] = [:]
        for index in 1...n {
            let update = (0..<length).map { _ in generator.nextFloat(symmetric: 1.5) }
            inputs[index] = .init(update: update, sampleCount: 1 + generator.nextInt(below: maximumSampleCount))
        }
        return inputs
    }

    /// The weighted mean of the clipped updates of `devices`, in Double.
    static func expectedMean(_ inputs: [Int: SecureAggregationCycle.Input], devices: [Int], clippingRange: Float) -> [Double] {
        let length = inputs.values.first!.update.count
        var sum = [Double](repeating: 0, count: length)
        var total = 0.0
        for device in devices {
            let input = inputs[device]!
            total += Double(input.sampleCount)
            for i in 0..<length {
                sum[i] += Double(input.sampleCount) * Double(min(max(input.update[i], -clippingRange), clippingRange))
            }
        }
        return sum.map { $0 / total }
    }

    /// The largest coordinate difference between `mean` and `expected`.
    static func maximumError(_ mean: [Float], _ expected: [Double]) -> Double {
        zip(mean, expected).map { abs(Double($0) - $1) }.max() ?? .infinity
    }

    /// A device at stage share_keys, with its advertisement.
    static func devices(_ count: Int, configuration: SecureAggregationParameters, length: Int, generator: inout some RandomNumberGenerator) throws
        -> [SecureAggregationDevice]
    {
        try (1...count).map {
            try SecureAggregationDevice(
                index: $0, configuration: configuration, context: context, maximumSampleCount: maximumSampleCount, modelLength: length, using: &generator)
        }
    }
}
