import Foundation
@testable import OrchardClient
import Testing

/// A model download cannot fill the device's disk: it stops at the length the coordinator announced (or, with none,
/// at the largest model a device takes), before its bytes are read back to be verified.
@Suite final class ModelDownloadBoundsTests {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-download-\(UUID().uuidString)")
    deinit { try? FileManager.default.removeItem(at: directory) }

    func store() throws -> ClientStore {
        let store = ClientStore(directory: directory, durability: .unsynced)
        try store.prepare()
        return store
    }

    @Test func aDownloadStopsAtItsAnnouncedLength() throws {
        let store = try store()
        let sink = store.partialSink(modelID: "p.1")
        try sink.begin(DownloadHead(start: 0, totalLength: 10, etag: nil))
        try sink.append([UInt8](repeating: 1, count: 6))
        try sink.append([UInt8](repeating: 2, count: 4))
        #expect(throws: OrchardClientError.self) { try sink.append([3]) }
        sink.close()
        #expect(try store.partialModelBytes().count == 10)

        // Resumed at byte 10 of 16: six more, not seven.
        let resumed = store.partialSink(modelID: "p.1")
        try resumed.begin(DownloadHead(start: 10, totalLength: 16, etag: nil))
        #expect(throws: OrchardClientError.self) { try resumed.append([UInt8](repeating: 4, count: 7)) }
        try resumed.append([UInt8](repeating: 4, count: 6))
        resumed.close()
        #expect(try store.partialModelBytes().count == 16)
    }

    @Test func anAnnouncedLengthBeyondTheLargestModelIsRefusedBeforeAnythingIsWritten() throws {
        let store = try store()
        let sink = store.partialSink(modelID: "p.1")
        do {
            try sink.begin(DownloadHead(start: 0, totalLength: PartialModelSink.largestModel + 1, etag: nil))
            Issue.record("a download announcing more than the largest model was begun")
        } catch {
            #expect(error.code == .serverError)
        }
        #expect(throws: OrchardClientError.self) { try sink.begin(DownloadHead(start: 20, totalLength: 10, etag: nil)) }
        #expect(try store.partialModel("p.1") == nil)
        // Without an announced length, a download takes up to the largest model.
        let open = store.partialSink(modelID: "p.1")
        try open.begin(DownloadHead(start: 0, totalLength: nil, etag: nil))
        try open.append([UInt8](repeating: 7, count: 1000))
        open.close()
        #expect(try store.partialModelBytes().count == 1000)
    }
}
