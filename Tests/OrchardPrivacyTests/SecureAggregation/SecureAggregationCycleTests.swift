import Foundation
import OrchardPrivacy
import OrchardSupport
import Testing

/// Whole cycles: the unmasked aggregate equals the plaintext weighted mean of the survivors within the quantisation
/// bound, with dropouts at every stage.
@Suite struct SecureAggregationRoundTests {
    static let secAgg = SecureAggregationParameters(threshold: 6, clippingRange: 1, quantizationRange: 1 << 16)
    static let secAggPlus = SecureAggregationParameters(shares: 8, threshold: 5, clippingRange: 1, quantizationRange: 1 << 16)

    static func check(
        _ outcome: SecureAggregationCycle.Outcome, inputs: [Int: SecureAggregationCycle.Input], survivors: [Int], configuration: SecureAggregationParameters
    ) throws {
        guard case .finished(let result) = outcome else {
            Issue.record("the cycle did not finish: \(outcome)")
            return
        }
        #expect(result.survivors == survivors)
        #expect(result.totalSampleCount == survivors.reduce(0) { $0 + inputs[$1]!.sampleCount })
        let expected = SecAggFixture.expectedMean(inputs, devices: survivors, clippingRange: configuration.clippingRange)
        let error = SecAggFixture.maximumError(result.mean, expected)
        #expect(error < configuration.quantizationStep + 1e-6, "error \(error) against step \(configuration.quantizationStep)")
        // Dropping a survivor's input would move the mean by far more than the bound.
        let without = SecAggFixture.expectedMean(inputs, devices: Array(survivors.dropFirst()), clippingRange: configuration.clippingRange)
        #expect(SecAggFixture.maximumError(result.mean, without) > 100 * configuration.quantizationStep)
    }

    @Test func secAggWithoutDropouts() throws {
        var generator = SplitMix64(seed: 1)
        let inputs = SecAggFixture.inputs(devices: 10, length: 1000, seed: 1)
        let outcome = try SecureAggregationCycle.run(
            configuration: Self.secAgg, context: SecAggFixture.context, inputs: inputs, maximumSampleCount: SecAggFixture.maximumSampleCount, using: &generator)
        try Self.check(outcome, inputs: inputs, survivors: Array(1...10), configuration: Self.secAgg)
    }

    @Test func secAggWithDropoutsAtEveryStage() throws {
        var generator = SplitMix64(seed: 2)
        let inputs = SecAggFixture.inputs(devices: 12, length: 1000, seed: 2)
        let configuration = SecureAggregationParameters(threshold: 6, clippingRange: 1, quantizationRange: 1 << 16)
        let dropouts = SecureAggregationCycle.Dropouts(advertiseKeys: [1], shareKeys: [5], maskedInput: [7, 12], unmask: [3])
        let outcome = try SecureAggregationCycle.run(
            configuration: configuration, context: SecAggFixture.context, inputs: inputs, maximumSampleCount: SecAggFixture.maximumSampleCount,
            dropouts: dropouts, using: &generator)
        // Device 3 dropped at unmask after sending its input: its input counts.
        try Self.check(outcome, inputs: inputs, survivors: [2, 3, 4, 6, 8, 9, 10, 11], configuration: configuration)
    }

    @Test func secAggPlusWithDropoutsAtEveryStage() throws {
        var generator = SplitMix64(seed: 3)
        let inputs = SecAggFixture.inputs(devices: 30, length: 1000, seed: 3)
        let dropouts = SecureAggregationCycle.Dropouts(advertiseKeys: [4, 17], shareKeys: [9], maskedInput: [2, 20, 26], unmask: [11, 30])
        let outcome = try SecureAggregationCycle.run(
            configuration: Self.secAggPlus, context: SecAggFixture.context, inputs: inputs, maximumSampleCount: SecAggFixture.maximumSampleCount,
            dropouts: dropouts, using: &generator)
        let survivors = (1...30).filter { ![4, 17, 9, 2, 20, 26].contains($0) }
        try Self.check(outcome, inputs: inputs, survivors: survivors, configuration: Self.secAggPlus)
    }

    @Test func tooFewAtAnyStageAbandons() throws {
        let configuration = SecureAggregationParameters(threshold: 4, clippingRange: 1, quantizationRange: 1 << 16)
        let inputs = SecAggFixture.inputs(devices: 7, length: 50, seed: 4)
        let plans: [(SecureAggregationCycle.Dropouts, String)] = [
            (.init(advertiseKeys: [1, 2, 3]), "advertise_keys"),  // 4 left: threshold + 1 = 5
            (.init(shareKeys: [1, 2, 3]), "share_keys"),
            (.init(shareKeys: [1], maskedInput: [2, 3]), "masked_input"),
            (.init(unmask: [1, 2, 3, 4]), "shares"),  // 3 responders < threshold 4
        ]
        for (plan, stage) in plans {
            var generator = SplitMix64(seed: 4)
            let outcome = try SecureAggregationCycle.run(
                configuration: configuration, context: SecAggFixture.context, inputs: inputs, maximumSampleCount: SecAggFixture.maximumSampleCount,
                dropouts: plan, using: &generator)
            guard case .abandoned(let reason) = outcome else {
                Issue.record("\(plan) finished")
                continue
            }
            #expect(reason.contains(stage), "\(reason)")
        }
        // Exactly threshold + 1 devices still finish.
        var generator = SplitMix64(seed: 5)
        let outcome = try SecureAggregationCycle.run(
            configuration: configuration, context: SecAggFixture.context, inputs: inputs, maximumSampleCount: SecAggFixture.maximumSampleCount,
            dropouts: .init(shareKeys: [1], maskedInput: [2]), using: &generator)
        try Self.check(outcome, inputs: inputs, survivors: Array(3...7), configuration: configuration)
    }

    /// The server's state, encoded to JSON and decoded after every stage, carries the cycle to the same result.
    @Test func serverStateSurvivesARestartAtEveryStage() throws {
        let inputs = SecAggFixture.inputs(devices: 12, length: 200, seed: 6)
        var stages: [SecureAggregationStage] = []
        var generator = SplitMix64(seed: 6)
        let outcome = try SecureAggregationCycle.run(
            configuration: Self.secAggPlus, context: SecAggFixture.context, inputs: inputs, maximumSampleCount: SecAggFixture.maximumSampleCount,
            dropouts: .init(shareKeys: [2], maskedInput: [5]), using: &generator
        ) { server in
            let data = try JSONEncoder().encode(server)
            let json = try #require(String(data: data, encoding: .utf8))
            #expect(json.contains("\"masked_sum\"") && json.contains("\"maximum_sample_count\""))
            server = try JSONDecoder().decode(SecureAggregationServer.self, from: data)
            stages.append(server.stage)
        }
        #expect(stages == [.shareKeys, .maskedInput, .unmask])
        try Self.check(outcome, inputs: inputs, survivors: (1...12).filter { $0 != 2 && $0 != 5 }, configuration: Self.secAggPlus)
    }
}
