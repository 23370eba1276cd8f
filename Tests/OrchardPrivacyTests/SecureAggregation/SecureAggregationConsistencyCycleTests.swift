import Foundation
import OrchardPrivacy
import OrchardSupport
import Testing

/// Whole actively-secure cycles (signed advertisements, the consistency_check stage): the aggregate equals the
/// plaintext weighted mean of the survivors within the quantisation bound, with dropouts at every stage.
@Suite struct SecureAggregationConsistencyRoundTests {
    static func configuration(shares: Int? = nil, threshold: Int) -> SecureAggregationParameters {
        SecureAggregationParameters(shares: shares, threshold: threshold, clippingRange: 1, quantizationRange: 1 << 16, consistencyCheck: true)
    }

    static func run(
        _ configuration: SecureAggregationParameters, devices n: Int, length: Int = 300, seed: UInt64, dropouts: SecureAggregationCycle.Dropouts = .init(),
        inspect: (inout SecureAggregationServer) throws -> Void = { _ in }
    ) throws -> (SecureAggregationCycle.Outcome, [Int: SecureAggregationCycle.Input]) {
        var generator = SplitMix64(seed: seed)
        let pki = try SignedFixture(devices: n, generator: &generator)
        let inputs = SecAggFixture.inputs(devices: n, length: length, seed: seed)
        let outcome = try SecureAggregationCycle.run(
            configuration: configuration, context: SecAggFixture.context, inputs: inputs, maximumSampleCount: SecAggFixture.maximumSampleCount,
            dropouts: dropouts, identities: pki.identities, trust: pki.trust, using: &generator, inspect: inspect)
        return (outcome, inputs)
    }

    @Test func signedRoundWithoutDropouts() throws {
        let configuration = Self.configuration(threshold: 6)
        var stages: [String] = []
        let (outcome, inputs) = try Self.run(configuration, devices: 10, seed: 21) { server in
            stages.append(server.isCheckingConsistency ? "consistency_check" : server.stage.rawValue)
        }
        #expect(stages == ["share_keys", "masked_input", "consistency_check", "unmask"])
        try SecureAggregationRoundTests.check(outcome, inputs: inputs, survivors: Array(1...10), configuration: configuration)
    }

    @Test func signedRoundWithDropoutsAtEveryStage() throws {
        let configuration = Self.configuration(threshold: 7)
        let dropouts = SecureAggregationCycle.Dropouts(advertiseKeys: [1], shareKeys: [5], maskedInput: [7, 12], consistencyCheck: [9], unmask: [3])
        var dropped: [Int] = []
        let (outcome, inputs) = try Self.run(configuration, devices: 14, seed: 22, dropouts: dropouts) { server in dropped = server.dropped }
        // Device 9 sent its input but did not sign: its input counts, it is dropped before unmask; device 3 likewise at unmask.
        #expect(dropped == [5, 7, 9, 12])
        try SecureAggregationRoundTests.check(outcome, inputs: inputs, survivors: [2, 3, 4, 6, 8, 9, 10, 11, 13, 14], configuration: configuration)
    }

    @Test func signedSecAggPlusWithDropouts() throws {
        let configuration = Self.configuration(shares: 8, threshold: 5)
        let dropouts = SecureAggregationCycle.Dropouts(advertiseKeys: [4], shareKeys: [9], maskedInput: [20], consistencyCheck: [15], unmask: [30])
        let (outcome, inputs) = try Self.run(configuration, devices: 30, length: 200, seed: 23, dropouts: dropouts)
        try SecureAggregationRoundTests.check(outcome, inputs: inputs, survivors: (1...30).filter { ![4, 9, 20].contains($0) }, configuration: configuration)
    }

    @Test func tooFewSignersAbandons() throws {
        let configuration = Self.configuration(threshold: 4)
        // 7 devices: 4 signers are fewer than threshold + 1 = 5.
        let (outcome, _) = try Self.run(configuration, devices: 7, length: 50, seed: 24, dropouts: .init(consistencyCheck: [1, 2, 3]))
        guard case .abandoned(let reason) = outcome else {
            Issue.record("the cycle finished with too few signers")
            return
        }
        #expect(reason.contains("consistency_check"), "\(reason)")
        // Exactly threshold + 1 signers finish (with every masked input in the sum).
        let (finished, inputs) = try Self.run(configuration, devices: 7, length: 50, seed: 25, dropouts: .init(consistencyCheck: [1, 2]))
        try SecureAggregationRoundTests.check(finished, inputs: inputs, survivors: Array(1...7), configuration: configuration)
    }

    /// The server's state, encoded to JSON and decoded after every stage (including consistency_check), carries the
    /// cycle to the same result.
    @Test func serverStateSurvivesARestartAtEveryStage() throws {
        let configuration = Self.configuration(shares: 8, threshold: 5)
        var checking: [Bool] = []
        let (outcome, inputs) = try Self.run(configuration, devices: 12, length: 200, seed: 26, dropouts: .init(shareKeys: [2], consistencyCheck: [5])) {
            server in
            let data = try JSONEncoder().encode(server)
            let json = try #require(String(data: data, encoding: .utf8))
            if server.isCheckingConsistency { #expect(json.contains("\"consistency_signatures\"")) }
            server = try JSONDecoder().decode(SecureAggregationServer.self, from: data)
            checking.append(server.isCheckingConsistency)
        }
        #expect(checking == [false, false, true, false])
        try SecureAggregationRoundTests.check(outcome, inputs: inputs, survivors: (1...12).filter { $0 != 2 }, configuration: configuration)
    }

    /// Mid-stage: with some signatures in, a decoded copy of the server finishes exactly as the original does.
    @Test func serverStateSurvivesARestartMidConsistencyCheck() throws {
        var cycle = try SignedCycle()
        try cycle.advertise()
        try cycle.share()
        try cycle.mask()
        #expect(cycle.server.isCheckingConsistency && cycle.server.awaitedDevices == Array(1...7))
        let requests = cycle.consistencyRequests
        var signatures: [Int: SecureAggregationConsistencySignature] = [:]
        for device in 1...7 { signatures[device] = try cycle.devices[device - 1].consistencyCheck(try #require(requests[device])) }
        for device in 1...3 { try cycle.server.receiveConsistencySignature(signatures[device]!) }
        #expect(cycle.server.awaitedDevices == [4, 5, 6, 7])

        var copy = cycle
        copy.server = try JSONDecoder().decode(SecureAggregationServer.self, from: try JSONEncoder().encode(cycle.server))
        #expect(copy.server.isCheckingConsistency && copy.server.signedDevices == [1, 2, 3])
        // A signature the original already holds is a duplicate for the copy too.
        #expect(secAggCode { try copy.server.receiveConsistencySignature(signatures[1]!) } == .duplicateMessage)
        var results: [SecureAggregationResult] = []
        for var run in [cycle, copy] {
            for device in 4...6 { try run.server.receiveConsistencySignature(signatures[device]!) }
            run.actions = try run.server.closeStage(using: &run.generator)
            #expect(run.server.dropped == [7])
            #expect(run.unmaskRequests.keys.sorted() == Array(1...6))
            results.append(try #require(try run.unmask()))
        }
        #expect(results[0] == results[1])
        #expect(results[0].survivors == Array(1...7) && results[0].totalSampleCount == 28)
    }

    /// Without consistency_check nothing changes: no signatures on the wire, and the configuration encodes as before.
    @Test func unsignedWireFormatIsUnchanged() throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let plain = SecureAggregationParameters(threshold: 3)
        #expect(
            String(decoding: try encoder.encode(plain), as: UTF8.self) == #"{"clipping_range":8,"modulus_bits":32,"quantization_range":65536,"threshold":3}"#)
        let decoded = try JSONDecoder().decode(
            SecureAggregationParameters.self, from: Data(#"{"clipping_range":8,"modulus_bits":32,"quantization_range":65536,"threshold":3}"#.utf8))
        #expect(decoded == plain && !decoded.consistencyCheck)
        let checked = SecureAggregationParameters(threshold: 3, consistencyCheck: true)
        #expect(String(decoding: try encoder.encode(checked), as: UTF8.self).contains(#""consistency_check":true"#))
        #expect(try JSONDecoder().decode(SecureAggregationParameters.self, from: try encoder.encode(checked)) == checked)

        let request = SecureAggregationUnmaskRequest(device: 1, survivors: [2], dropped: [3])
        #expect(String(decoding: try encoder.encode(request), as: UTF8.self) == #"{"device":1,"dropped":[3],"survivors":[2]}"#)
        let advertisement = SecureAggregationAdvertisement(device: 1, channelPublicKey: Data([1]), maskPublicKey: Data([2]))
        #expect(String(decoding: try encoder.encode(advertisement), as: UTF8.self) == #"{"channel_public_key":"AQ==","device":1,"mask_public_key":"Ag=="}"#)

        // Signed messages carry their parts in snake_case and round-trip.
        var cycle = try SignedCycle()
        try cycle.advertise()
        let signed = try #require(cycle.roster(1)?.keys.first)
        let json = String(decoding: try encoder.encode(signed), as: UTF8.self)
        #expect(json.contains(#""signed":{"certificate":{"expires_at":"#) && json.contains(#""signing_public_key""#))
        #expect(try JSONDecoder().decode(SecureAggregationAdvertisement.self, from: Data(json.utf8)) == signed)
        let withSignatures = SecureAggregationUnmaskRequest(device: 1, survivors: [2], dropped: [], signatures: [.init(device: 2, signature: Data([9]))])
        #expect(String(decoding: try encoder.encode(withSignatures), as: UTF8.self).contains(#""signatures":[{"device":2,"signature":"CQ=="}]"#))
        #expect(try JSONDecoder().decode(SecureAggregationUnmaskRequest.self, from: try encoder.encode(withSignatures)) == withSignatures)
    }
}
