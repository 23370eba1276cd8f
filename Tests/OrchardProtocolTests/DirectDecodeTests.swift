import Foundation
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// The check-in read without `JSONDecoder` (`CycleRequest.directDecode`): where it answers, it answers what the
/// strict decoder does; everything it does not handle is left to that decoder.
@Suite(.shrinking(false)) struct DirectDecodeTests {
    static let valid = CycleRequest(
        workerID: "w_0123456789abcdef01234567", processName: "tiny", processVersion: SemanticVersion(1, 2), downloadMbps: 10.5, uploadMbps: 2)
    /// The same with the tasks a 2.5 device offers (the fuzzing template, so mutations reach the tasks too).
    static let withTasks = CycleRequest(
        workerID: "w_0123456789abcdef01234567", processName: "tiny", processVersion: SemanticVersion(1, 2), downloadMbps: 10.5, uploadMbps: 2,
        tasks: [.evaluation, .training])

    func direct(_ text: String) -> CycleRequest? {
        Array(text.utf8).withUnsafeBytes { CycleRequest.directDecode($0) }
    }

    func strict(_ bytes: [UInt8]) -> CycleRequest? {
        try? WireCoding.strictDecoder().decode(CycleRequest.self, from: Data(bytes))
    }

    @Test func encodedRequestsDecodeToThemselves() throws {
        var random = SplitMix64(seed: 9)
        let names = ["tiny", "a", "process-name_1.2", String(repeating: "x", count: 200), " spaced "]
        let numbers: [Double] = [0, 1, 0.5, 1e-5, 123456.789, 1e300, 3.141592653589793]
        for _ in 0..<300 {
            let request = CycleRequest(
                workerID: "w_" + String(random.next(), radix: 16), processName: names[Int(random.next() % UInt64(names.count))],
                processVersion: SemanticVersion(components: (0..<Int(1 + random.next() % 4)).map { _ in Int(random.next() % 1000) }),
                downloadMbps: random.next() % 2 == 0 ? nil : numbers[Int(random.next() % UInt64(numbers.count))],
                uploadMbps: random.next() % 2 == 0 ? nil : numbers[Int(random.next() % UInt64(numbers.count))],
                tasks: [nil, [], [.training], [.evaluation], [.evaluation, .training], [.training, .training]][Int(random.next() % 6)]
            )
            let bytes = Array(try WireCoding.encoder().encode(request))
            let decoded = bytes.withUnsafeBytes { CycleRequest.directDecode($0) }
            #expect(decoded == request)
            #expect(decoded == strict(bytes))
        }
    }

    @Test func whitespaceAndKeyOrderDoNotMatter() {
        let text =
            " {\n\t\"process_version\" : \"1.2.0\" ,\"process_name\":\"tiny\",\r\n \"upload_mbps\":2E0, \"worker_id\":\"w_0123456789abcdef01234567\",\"download_mbps\":1.05e1 } \n"
        #expect(direct(text) == Self.valid)
        #expect(strict(Array(text.utf8)) == Self.valid)
        #expect(
            direct(#"{"worker_id":"w","process_name":"p","process_version":"1"}"#)
                == CycleRequest(workerID: "w", processName: "p", processVersion: SemanticVersion(1)))
    }

    @Test(arguments: [
        #"{"worker_id":"w\u0041","process_name":"p","process_version":"1"}"#,  // an escape
        #"{"worker_id":"w","process_name":"p","process_version":"1","upload_mbps":null}"#,  // null
        #"{"worker_id":"w","process_name":"p","process_version":"1","extra":1}"#,  // an unknown key (strict: refused)
        #"{"worker_id":"w","worker_id":"v","process_name":"p","process_version":"1"}"#,  // a repeated key
        #"{"worker_id":"w","process_name":"p"}"#,  // a missing key
        #"{"worker_id":"w","process_name":"p","process_version":"1.x"}"#,  // a bad version
        #"{"worker_id":"w","process_name":"pä","process_version":"1"}"#,  // non-ASCII (the strict decoder validates UTF-8)
        #"{"worker_id":"w","process_name":"p","process_version":"1"} x"#,  // trailing bytes
        #"{"worker_id":"w","process_name":"p","process_version":"1","upload_mbps":01}"#,  // a leading zero
        #"{"worker_id":"w","process_name":"p","process_version":"1","upload_mbps":1e999}"#,  // not finite
        #"{"worker_id":"w","process_name":"p","process_version":"1","upload_mbps":"2"}"#,  // a string for a number
        #"{"worker_id":"w","process_name":"p","process_version":"1",}"#,  // a trailing comma
        #"{"worker_id":5,"process_name":"p","process_version":"1"}"#,  // a number for a string
        #"{"worker_id":"w","process_name":"p","process_version":"1","tasks":["training","sleeping"]}"#,  // an unknown task
        #"{"worker_id":"w","process_name":"p","process_version":"1","tasks":"training"}"#,  // not an array
        #"{"worker_id":"w","process_name":"p","process_version":"1","tasks":["training",]}"#,  // a trailing comma
        #"{"worker_id":"w","process_name":"p","process_version":"1","tasks":[],"tasks":[]}"#,  // a repeated key
        #"["worker_id"]"#, "", "{", "{}",
    ])
    func anythingElseIsLeftToTheStrictDecoder(_ text: String) {
        #expect(direct(text) == nil)
    }

    static let template = try! JSONValue.parse(WireCoding.encoder().encode(withTasks))

    @Test func mutatedAndArbitraryBodiesNeverDisagreeWithTheStrictDecoder() async {
        let mutated = fuzzed { Fuzz.mutate(Self.template, edits: 3, using: &$0) }
        await propertyCheck(count: 500, input: mutated) { json in
            let bytes = Fuzz.json(json)
            if let fast = bytes.withUnsafeBytes({ CycleRequest.directDecode($0) }) {
                #expect(fast == strict(bytes), "\(String(decoding: bytes, as: UTF8.self))")
            }
        }
        let arbitrary = fuzzed { Fuzz.bytes(maximum: 300, using: &$0) }
        await propertyCheck(count: 500, input: arbitrary) { bytes in
            if let fast = bytes.withUnsafeBytes({ CycleRequest.directDecode($0) }) { #expect(fast == strict(bytes)) }
        }
    }
}
