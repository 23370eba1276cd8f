import Foundation
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import Testing

/// The check-in answer written directly decodes to the same value, and is the same JSON object, as the one
/// `JSONEncoder` writes — over seeded random answers with awkward strings and numbers.
@Suite struct DirectJSONTests {
    static let strings = ["", "p_0123abcd", "a\"quote", "back\\slash", "tab\tnew\nline\r", "\u{01}\u{1F}", "ünïcødé 🌳", "</script>", "/slash"]
    static let numbers: [Double] = [
        0, -0.0, 1, 600, 599.5, 0.1, 1e-5, 1e-300, 3.141592653589793, 1e15, 1e16, 1e20, -42.25, 123456789.123, Double.greatestFiniteMagnitude,
    ]

    func objects(_ bytes: [UInt8]) throws -> NSDictionary {
        try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? NSDictionary)
    }

    @Test func directAnswersMatchTheEncoder() throws {
        var random = SplitMix64(seed: 42)
        func pick<T>(_ values: [T]) -> T { values[Int(random.next() % UInt64(values.count))] }
        for round in 0..<400 {
            let answer: CycleResponse =
                round % 3 == 0
                ? .rejected(CycleRejection(retryAfter: pick(Self.numbers), reason: pick(Self.strings)))
                : .accepted(
                    CycleAssignment(
                        requestKey: pick(Self.strings), processID: pick(Self.strings), cycle: Int(random.next() % 1_000_000),
                        checkpoint: Int(random.next() % 1000),
                        modelID: pick(Self.strings), planID: pick(Self.strings), reportWithin: pick(Self.numbers)
                    ))
            let direct = try #require(answer.directJSON())
            let encoded = Array(try WireCoding.encoder().encode(answer))
            #expect(try WireCoding.decoder().decode(CycleResponse.self, from: Data(direct)) == answer)
            #expect(try objects(direct) == objects(encoded), "\(String(decoding: direct, as: UTF8.self)) vs \(String(decoding: encoded, as: UTF8.self))")
        }
    }

    @Test func secureAggregationWaitsAndPollsMatchTheEncoder() throws {
        var random = SplitMix64(seed: 7)
        func pick<T>(_ values: [T]) -> T { values[Int(random.next() % UInt64(values.count))] }
        let stages: [SecureAggregationStage] = [.advertiseKeys, .shareKeys, .maskedInput, .consistencyCheck, .unmask, .done, .abandoned]
        let steps: [SecureAggregationNextStep] = [.wait, .shareKeys, .maskedInput, .consistencyCheck, .unmask, .done]
        for round in 0..<400 {
            let reply = SecureAggregationReply(
                cycle: Int(random.next() % 1_000_000), device: Int(random.next() % 1000) + 1, stage: pick(stages), next: pick(steps),
                retryAfter: round % 4 == 0 ? nil : pick(Self.numbers), cycleClosed: round % 5 == 0,
                maskedInputFormat: round % 3 == 0 ? pick([.json, .safetensors]) : nil
            )
            let direct = try #require(reply.directJSON())
            let encoded = Array(try WireCoding.encoder().encode(reply))
            #expect(try WireCoding.decoder().decode(SecureAggregationReply.self, from: Data(direct)) == reply)
            #expect(try objects(direct) == objects(encoded), "\(String(decoding: direct, as: UTF8.self)) vs \(String(decoding: encoded, as: UTF8.self))")
            #expect(direct.count == encoded.count, "the simulator counts a reply's bytes from it")

            let poll = SecureAggregationRequest(workerID: pick(Self.strings), requestKey: pick(Self.strings))
            let polled = try #require(poll.directJSON())
            let pollEncoded = Array(try WireCoding.encoder().encode(poll))
            #expect(try WireCoding.decoder().decode(SecureAggregationRequest.self, from: Data(polled)) == poll)
            #expect(try objects(polled) == objects(pollEncoded))
            #expect(polled.count == pollEncoded.count)
        }
    }

    @Test func secureAggregationMessagesAndPayloadsAreLeftToTheEncoder() {
        let roster = SecureAggregationRoster(participants: [1, 2, 3], graphSeed: Data(repeating: 1, count: 32), keys: [])
        #expect(SecureAggregationReply(cycle: 1, device: 1, stage: .shareKeys, next: .shareKeys, roster: roster).directJSON() == nil)
        #expect(SecureAggregationReply(cycle: 1, device: 1, stage: .advertiseKeys, next: .wait, retryAfter: .infinity).directJSON() == nil)
        #expect(SecureAggregationReply(cycle: 1, device: 1, stage: .advertiseKeys, next: .wait, retryAfter: .nan).directJSON() == nil)
        let keys = SecureAggregationPublicKeys(channelPublicKey: Data(repeating: 2, count: 32), maskPublicKey: Data(repeating: 3, count: 32))
        #expect(SecureAggregationRequest(workerID: "w", requestKey: "k", advertiseKeys: keys).directJSON() == nil)
    }

    @Test func nonFiniteNumbersAreLeftToTheEncoder() {
        #expect(CycleResponse.rejected(CycleRejection(retryAfter: .infinity, reason: "x")).directJSON() == nil)
        #expect(CycleResponse.rejected(CycleRejection(retryAfter: .nan, reason: "x")).directJSON() == nil)
    }
}
