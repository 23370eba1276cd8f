import Dispatch
import Foundation
import OrchardSupport
import Testing

@Suite struct OffCooperativePoolTests {
    struct Refused: Error, Equatable { let code: Int }

    @Test func returnsTheBodysValueComputedOnADispatchThread() async throws {
        #if os(Linux)
        // Dispatch names a worker thread after its root queue (the last 15 characters: "oot.utility-qos"); the Swift
        // cooperative pool's threads are the default-QoS root queue's.
        let name = await offCooperativePool(qos: .utility) { () throws(Never) -> String in
            ((try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #expect(name.hasSuffix("utility-qos"), "ran on thread '\(name)'")
        #endif
        let sum = await offCooperativePool { () throws(Never) -> Int in (1...1000).reduce(0, +) }
        #expect(sum == 500_500)
    }

    @Test func rethrowsTheBodysTypedError() async {
        await #expect(throws: Refused(code: 7)) {
            try await offCooperativePool { () throws(Refused) -> Int in throw Refused(code: 7) }
        }
    }
}
