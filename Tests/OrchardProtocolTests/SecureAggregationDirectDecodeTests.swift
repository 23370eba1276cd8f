import Foundation
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// Secure aggregation's polls and waits read without `JSONDecoder` (`SecureAggregationRequest.directDecode` on the
/// coordinator, `SecureAggregationReply.directDecode` on the device): where they answer, they answer what the decoder
/// each side uses would; everything else is left to that decoder.
@Suite(.shrinking(false)) struct SecureAggregationDirectDecodeTests {
    static let wait = SecureAggregationReply(cycle: 3, device: 7, stage: .shareKeys, next: .wait, retryAfter: 3.3333333333333335)
    static let poll = SecureAggregationRequest(workerID: "w_0123456789abcdef01234567", requestKey: "k_0123456789abcdef")

    func reply(_ bytes: [UInt8]) -> SecureAggregationReply? { bytes.withUnsafeBytes { SecureAggregationReply.directDecode($0) } }
    func request(_ bytes: [UInt8]) -> SecureAggregationRequest? { bytes.withUnsafeBytes { SecureAggregationRequest.directDecode($0) } }
    func decoded(_ bytes: [UInt8]) -> SecureAggregationReply? { try? WireCoding.decoder().decode(SecureAggregationReply.self, from: Data(bytes)) }
    func strict(_ bytes: [UInt8]) -> SecureAggregationRequest? {
        try? WireCoding.strictDecoder().decode(SecureAggregationRequest.self, from: Data(bytes))
    }

    @Test func encodedWaitsAndPollsDecodeToThemselves() throws {
        var random = SplitMix64(seed: 11)
        let stages: [SecureAggregationStage] = [.advertiseKeys, .shareKeys, .maskedInput, .consistencyCheck, .unmask]
        let steps: [SecureAggregationNextStep] = [.wait, .shareKeys, .maskedInput, .unmask]
        let waits: [Double?] = [nil, 0.001, 1, 2, 3.3333333333333335, 1e-5, 600, 0]
        for _ in 0..<300 {
            let value = SecureAggregationReply(
                cycle: Int(random.next() % 10_000), device: 1 + Int(random.next() % 1000), stage: stages[Int(random.next() % 5)],
                next: steps[Int(random.next() % 4)], retryAfter: waits[Int(random.next() % UInt64(waits.count))], cycleClosed: random.next() % 2 == 0,
                maskedInputFormat: [nil, .json, .safetensors][Int(random.next() % 3)])
            // What the coordinator writes (directly) and what JSONEncoder writes are both read.
            for bytes in [try #require(value.directJSON()), Array(try WireCoding.encoder().encode(value))] {
                #expect(reply(bytes) == value)
                #expect(reply(bytes) == decoded(bytes))
            }
            let poll = SecureAggregationRequest(workerID: "w_" + String(random.next(), radix: 16), requestKey: String(random.next(), radix: 36))
            for bytes in [try #require(poll.directJSON()), Array(try WireCoding.encoder().encode(poll))] {
                #expect(request(bytes) == poll)
                #expect(request(bytes) == strict(bytes))
            }
        }
    }

    @Test func whitespaceAndKeyOrderDoNotMatter() {
        let text = #" { "stage" : "share_keys", "retry_after":3.3333333333333335 ,"next":"wait","cycle_closed":false,"device":7,"cycle":3 } "#
        #expect(reply(Array(text.utf8)) == Self.wait)
        #expect(decoded(Array(text.utf8)) == Self.wait)
        let poll = #"{ "worker_id" : "w_0123456789abcdef01234567","request_key":"k_0123456789abcdef" }"#
        #expect(request(Array(poll.utf8)) == Self.poll)
    }

    @Test(arguments: [
        #"{"cycle":3,"cycle_closed":false,"device":7,"next":"wait","retry_after":null,"stage":"share_keys"}"#,  // null
        #"{"cycle":3.0,"cycle_closed":false,"device":7,"next":"wait","stage":"share_keys"}"#,  // a fraction for an integer
        #"{"cycle":1e2,"cycle_closed":false,"device":7,"next":"wait","stage":"share_keys"}"#,  // an exponent for an integer
        #"{"cycle":03,"cycle_closed":false,"device":7,"next":"wait","stage":"share_keys"}"#,  // a leading zero
        #"{"cycle":99999999999999999999,"cycle_closed":false,"device":7,"next":"wait","stage":"share_keys"}"#,  // too large
        #"{"cycle":3,"cycle_closed":0,"device":7,"next":"wait","stage":"share_keys"}"#,  // a number for a boolean
        #"{"cycle":3,"device":7,"next":"wait","stage":"share_keys"}"#,  // cycle_closed missing
        #"{"cycle":3,"cycle_closed":false,"device":7,"next":"sleep","stage":"share_keys"}"#,  // an unknown step
        #"{"cycle":3,"cycle_closed":false,"device":7,"next":"wait","stage":"share\u005fkeys"}"#,  // an escape
        #"{"cycle":3,"cycle":4,"cycle_closed":false,"device":7,"next":"wait","stage":"share_keys"}"#,  // a repeated key
        #"{"cycle":3,"cycle_closed":false,"device":7,"next":"wait","stage":"share_keys","roster":null}"#,  // a stage input
        #"{"cycle":3,"cycle_closed":false,"device":7,"next":"wait","stage":"share_keys"} x"#,  // trailing bytes
        #"{"cycle":3,"cycle_closed":false,"device":7,"next":"wait","stage":"share_keys",}"#,  // a trailing comma
        #"{"cycle":3,"cycle_closed":false,"device":7,"next":"wait","retry_after":1e999,"stage":"share_keys"}"#,  // not finite
        "", "{", "{}", "[]",
    ])
    func anyOtherReplyIsLeftToTheDecoder(_ text: String) {
        #expect(reply(Array(text.utf8)) == nil)
    }

    @Test(arguments: [
        #"{"request_key":"k","worker_id":"w","advertise_keys":{"channel_public_key":"","mask_public_key":""}}"#,  // a stage message
        #"{"request_key":"k"}"#,  // worker_id missing
        #"{"request_key":"k","worker_id":"w","worker_id":"v"}"#,  // a repeated key
        #"{"request_key":"k","worker_id":"w\u0041"}"#,  // an escape
        #"{"request_key":"k","worker_id":5}"#,  // a number for a string
        #"{"request_key":"k","worker_id":"wä"}"#,  // non-ASCII
        #"{"request_key":"k","worker_id":"w"} x"#,  // trailing bytes
        "", "{", "{}",
    ])
    func anyOtherRequestIsLeftToTheStrictDecoder(_ text: String) {
        #expect(request(Array(text.utf8)) == nil)
    }

    @Test func mutatedAndArbitraryBodiesNeverDisagreeWithTheDecoders() async throws {
        let replyTemplate = try JSONValue.parse(
            WireCoding.encoder().encode(
                SecureAggregationReply(
                    cycle: 3, device: 7, stage: .maskedInput, next: .wait, retryAfter: 2, cycleClosed: true, maskedInputFormat: .safetensors)))
        let mutatedReplies = fuzzed { Fuzz.mutate(replyTemplate, edits: 3, using: &$0) }
        await propertyCheck(count: 500, input: mutatedReplies) { json in
            let bytes = Fuzz.json(json)
            if let fast = reply(bytes) { #expect(fast == decoded(bytes), "\(String(decoding: bytes, as: UTF8.self))") }
        }
        let pollTemplate = try JSONValue.parse(WireCoding.encoder().encode(Self.poll))
        let mutatedPolls = fuzzed { Fuzz.mutate(pollTemplate, edits: 3, using: &$0) }
        await propertyCheck(count: 500, input: mutatedPolls) { json in
            let bytes = Fuzz.json(json)
            if let fast = request(bytes) { #expect(fast == strict(bytes), "\(String(decoding: bytes, as: UTF8.self))") }
        }
        let arbitrary = fuzzed { Fuzz.bytes(maximum: 300, using: &$0) }
        await propertyCheck(count: 500, input: arbitrary) { bytes in
            if let fast = reply(bytes) { #expect(fast == decoded(bytes)) }
            if let fast = request(bytes) { #expect(fast == strict(bytes)) }
        }
    }
}
