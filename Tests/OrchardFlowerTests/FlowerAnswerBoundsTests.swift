@testable import OrchardFlower
import Testing

/// A message's arrays are counted against the model before any is converted: names may share one stored array, so a
/// record of many names must not be converted name by name before the count refuses it.
@Suite struct FlowerAnswerBoundsTests {
    @Test func aRecordWithMoreNamesThanParametersIsRefusedBeforeItsArraysAreConverted() throws {
        let app = try FlowerLocalApp(model: try FlowerFederationTests.model(), dataset: try FlowerFederationTests.dataset(seed: 1, samples: 8))
        // One array under 100,000 names: converting each would take 100,000 copies of it.
        let shared = FlowerArray([Float](repeating: 0.5, count: 4096), shape: [4096])
        let arrays = ArrayRecord((0..<100_000).map { ("a\($0)", shared) })
        let message = FlowerMessage(
            metadata: FlowerMetadata(runID: 1, srcNodeID: 0, dstNodeID: 1, ttl: 60, messageType: "train", createdAt: 0),
            body: .content(["arrays": .arrays(arrays)]))
        do {
            _ = try FlowerContent.answer(message, app: app)
            Issue.record("a record of 100,000 arrays was answered")
        } catch {
            #expect(error.code == .arrayMismatch)
            #expect(error.message.contains("100000 arrays"), "\(error.message)")
        }
    }
}
