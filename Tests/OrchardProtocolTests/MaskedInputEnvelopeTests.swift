import Foundation
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// The masked input as a safetensors body: it decodes to the request it was made from, 4 bytes a word, and nothing
/// else decodes.
@Suite(.shrinking(false)) struct MaskedInputEnvelopeTests {
    static let request = SecureAggregationRequest(
        workerID: "w_0123456789abcdef", requestKey: "k_fedcba9876543210",
        maskedInput: SecureAggregationMaskedInput(device: 7, words: [0, 1, 0xFFFF_FFFF, 0x8000_0000, 12345]))

    @Test func aBodyDecodesToTheRequestItWasMadeFrom() throws {
        var random = SplitMix64(seed: 3)
        for count in [1, 2, 5, 1000, 199_211] {
            var request = Self.request
            request.maskedInput = SecureAggregationMaskedInput(
                device: 1 + Int(random.next() % 1000), words: (0..<count).map { _ in UInt32(truncatingIfNeeded: random.next()) })
            let body = MaskedInputEnvelope.encode(request)
            #expect(try MaskedInputEnvelope.decode(body) == request)
            // The words take 4 bytes each; the JSON form takes a third more in base64 alone.
            #expect(body.count <= count * 4 + 256)
            let json = try WireCoding.encoder().encode(request)
            if count >= 1000 { #expect(Double(json.count) > 1.25 * Double(body.count)) }
            let index = try Safetensors.index(body)
            #expect(index.entries.map(\.dtype) == [.uint32])
        }
    }

    @Test func otherBodiesAreRefused() throws {
        let words = 5
        let header = #"{"device":7,"request_key":"k","worker_id":"w"}"#
        func body(_ layout: [(name: String, dtype: DType, shape: [Int])], _ metadata: [String: String], bytes: Int) -> [UInt8] {
            Safetensors.encodeHeader(layout: layout, metadata: metadata) + Array(repeating: 0, count: bytes)
        }
        let key = MaskedInputEnvelope.metadataKey
        let cases: [(String, [UInt8])] = [
            ("empty", []),
            (
                "a report",
                ReportEnvelope.encode(
                    diff: [TensorRecord(name: "masked_input", shape: [5], values: [0, 0, 0, 0, 0])],
                    metadata: ReportMetadata(workerID: "w", requestKey: "k", sampleCount: 1))
            ),
            ("F32", body([("masked_input", .float32, [words])], [key: header], bytes: words * 4)),
            ("I32", body([("masked_input", .int32, [words])], [key: header], bytes: words * 4)),
            ("rank 0", body([("masked_input", .uint32, [])], [key: header], bytes: 4)),
            ("rank 2", body([("masked_input", .uint32, [1, words])], [key: header], bytes: words * 4)),
            ("another name", body([("words", .uint32, [words])], [key: header], bytes: words * 4)),
            ("two tensors", body([("masked_input", .uint32, [words]), ("x", .uint32, [1])], [key: header], bytes: words * 4 + 4)),
            ("no metadata", body([("masked_input", .uint32, [words])], [:], bytes: words * 4)),
            ("another metadata pair", body([("masked_input", .uint32, [words])], [key: header, "a": "b"], bytes: words * 4)),
            ("an unknown key", body([("masked_input", .uint32, [words])], [key: #"{"device":7,"request_key":"k","worker_id":"w","x":1}"#], bytes: words * 4)),
            ("a missing key", body([("masked_input", .uint32, [words])], [key: #"{"device":7,"request_key":"k"}"#], bytes: words * 4)),
            ("a string device", body([("masked_input", .uint32, [words])], [key: #"{"device":"7","request_key":"k","worker_id":"w"}"#], bytes: words * 4)),
            ("not JSON", body([("masked_input", .uint32, [words])], [key: "device=7"], bytes: words * 4)),
            ("short data", body([("masked_input", .uint32, [words])], [key: header], bytes: words * 4 - 1)),
            ("long data", body([("masked_input", .uint32, [words])], [key: header], bytes: words * 4 + 4)),
        ]
        for (name, bytes) in cases {
            #expect(throws: FormatError.self, "\(name)") { try MaskedInputEnvelope.decode(bytes) }
        }
    }

    @Test func arbitraryAndMutatedBodiesNeverCrashAndDecodeOnlyToCheckedRequests() async {
        let valid = MaskedInputEnvelope.encode(Self.request)
        let mutated = fuzzed { (random: inout SplitMix64) -> [UInt8] in
            var bytes = valid
            for _ in 0..<(1 + Int(random.next() % 4)) {
                let i = Int(random.next() % UInt64(bytes.count))
                switch random.next() % 3 {
                case 0: bytes[i] = UInt8(truncatingIfNeeded: random.next())
                case 1: bytes.remove(at: i)
                default: bytes.insert(UInt8(truncatingIfNeeded: random.next()), at: i)
                }
            }
            return bytes
        }
        await propertyCheck(count: 500, input: mutated) { bytes in
            if let request = try? MaskedInputEnvelope.decode(bytes) {
                #expect(request.maskedInput != nil)
                #expect(request.messageCount == 1)
            }
        }
        let arbitrary = fuzzed { Fuzz.bytes(maximum: 300, using: &$0) }
        await propertyCheck(count: 500, input: arbitrary) { bytes in _ = try? MaskedInputEnvelope.decode(bytes) }
    }
}
