import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

/// The SQLite store's diff spool: report diffs live in files beside the database until folded.
@Suite final class SQLiteStoreTests {
    let directory: URL
    var path: String { directory.appendingPathComponent("store.sqlite").path }
    var spool: URL { URL(fileURLWithPath: path + "-spool") }

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-store-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: directory) }

    /// A store holding process `p` with cycle 1 open and `workers` admitted as `w<i>` with keys `k<i>`.
    func openStore(workers: Int) async throws -> SQLiteStore {
        let store = try SQLiteStore(path: path)
        let host = Fixture.host()
        let process = StoredProcess(
            id: "p", name: host.name, version: host.version, model: host.model, clientConfig: host.clientConfig,
            serverConfig: host.serverConfig, createdAt: Date(timeIntervalSince1970: 0)
        )
        try await store.createProcess(
            process, initialWeights: host.initialWeights, firstCycle: StoredCycle(number: 1, checkpoint: 0, openedAt: Date(timeIntervalSince1970: 0)))
        for i in 0..<workers {
            try await store.registerWorker(id: "w\(i)", processID: "p", issuer: nil, subject: nil, at: Date(timeIntervalSince1970: 0))
            try await store.recordAssignment(processID: "p", cycle: 1, workerID: "w\(i)", requestKey: "k\(i)", at: Date(timeIntervalSince1970: 0))
        }
        return store
    }

    func report(_ i: Int) -> ReportRecord {
        ReportRecord(processID: "p", cycle: 1, workerID: "w\(i)", requestKey: "k\(i)", sampleCount: i + 1, metricsJSON: "{}")
    }

    func spooledFiles() -> [String] {
        let cycle = spool.appendingPathComponent("p/1")
        return ((try? FileManager.default.contentsOfDirectory(atPath: cycle.path)) ?? []).sorted()
    }

    func pending(_ store: SQLiteStore) async throws -> [String: [UInt8]] {
        let collected = Collected()
        try await store.forEachPendingDiff(processID: "p", cycle: 1) { collected.add($0.workerID, $0.diff) }
        return collected.value
    }

    @Test func diffsAreSpooledUntilFoldedAndTheCycleFolderGoesWhenItCloses() async throws {
        let store = try await openStore(workers: 3)
        let diffs = (0..<3).map { i in (0..<16).map { UInt8(truncatingIfNeeded: $0 * (i + 3)) } }
        for i in 0..<3 { try await store.recordReport(report(i), bytes: diffs[i]) }
        #expect(spooledFiles().count == 3)
        #expect(try await pending(store) == ["w0": diffs[0], "w1": diffs[1], "w2": diffs[2]])

        try await store.foldReports(processID: "p", cycle: 1, sum: [UInt8](repeating: 0, count: 8), weight: 3, reports: 2, workers: ["w0", "w1"])
        #expect(spooledFiles().count == 1)
        #expect(try await pending(store) == ["w2": diffs[2]])

        try await store.closeCycle(
            CycleClosure(
                processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil,
                nextCycle: StoredCycle(number: 2, checkpoint: 0, openedAt: Date(timeIntervalSince1970: 1)), retention: 2))
        #expect(!FileManager.default.fileExists(atPath: spool.appendingPathComponent("p/1").path))
    }

    @Test func aRefusedDuplicateLeavesTheCommittedDiffInPlace() async throws {
        let store = try await openStore(workers: 1)
        let original: [UInt8] = [1, 2, 3, 4]
        try await store.recordReport(report(0), bytes: original)
        await #expect(throws: StoreError.self) { try await store.recordReport(report(0), bytes: [9, 9, 9, 9]) }
        #expect(spooledFiles().count == 1)
        #expect(try await pending(store) == ["w0": original])
    }

    @Test func filesNoCommittedRowNamesAreSweptOnOpen() async throws {
        do {
            let store = try await openStore(workers: 1)
            try await store.recordReport(report(0), bytes: [5, 6, 7, 8])
        }
        // What a crash between a file's write and its row's commit leaves behind.
        let stray = spool.appendingPathComponent("p/1/k9-stray.f32")
        try Data([1, 1, 1, 1]).write(to: stray)
        let closed = spool.appendingPathComponent("p/7")
        try FileManager.default.createDirectory(at: closed, withIntermediateDirectories: true)
        try Data([2]).write(to: closed.appendingPathComponent("k0-old.f32"))

        let reopened = try SQLiteStore(path: path)
        #expect(!FileManager.default.fileExists(atPath: stray.path))
        #expect(!FileManager.default.fileExists(atPath: closed.path))
        #expect(try await pending(reopened) == ["w0": [5, 6, 7, 8]])
    }

    /// A spooled diff a power loss left missing comes back with no bytes (the caller sees it is not the model's length
    /// and discards the report), and discarding it leaves the cycle without it.
    @Test func aMissingSpooledDiffComesBackEmptyAndCanBeDiscarded() async throws {
        let store = try await openStore(workers: 2)
        try await store.recordReport(report(0), bytes: [1, 2, 3, 4])
        let kept = Set(spooledFiles())
        try await store.recordReport(report(1), bytes: [5, 6, 7, 8])
        for file in Set(spooledFiles()).subtracting(kept) { try FileManager.default.removeItem(at: spool.appendingPathComponent("p/1/\(file)")) }
        #expect(try await pending(store) == ["w0": [1, 2, 3, 4], "w1": []])
        try await store.discardReports(processID: "p", cycle: 1, workers: ["w1"])
        #expect(try await pending(store) == ["w0": [1, 2, 3, 4]])
        #expect(try await store.cycleProgress(processID: "p")?.reported == 1)
    }

    @Test func maskedInputWordsAreSpooledReadBackKeptByTheSweepAndGoWithTheCycle() async throws {
        let words: [UInt8] = (0..<64).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let events = [
            StoredSecureAggregationEvent(sequence: 0, body: Array("{}".utf8)),
            StoredSecureAggregationEvent(sequence: 1, body: Array("{\"masked\":1}".utf8), words: words),
        ]
        do {
            let store = try await openStore(workers: 1)
            for event in events { try await store.appendSecureAggregationEvent(event, processID: "p", cycle: 1, reportedWorker: nil) }
            // The words are in one spool file, not in the database row.
            #expect(spooledFiles().count == 1)
            #expect(try await store.secureAggregationEvents(processID: "p", cycle: 1) == events)
            // A step refused as a duplicate leaves no file behind and the committed one in place.
            await #expect(throws: StoreError.self) {
                try await store.appendSecureAggregationEvent(
                    StoredSecureAggregationEvent(sequence: 1, body: [0], words: [9, 9, 9, 9]), processID: "p", cycle: 1, reportedWorker: nil)
            }
            #expect(spooledFiles().count == 1)
        }
        // Reopened (as after a crash): the file a committed row names survives the sweep and replays the same words.
        let reopened = try SQLiteStore(path: path)
        #expect(try await reopened.secureAggregationEvents(processID: "p", cycle: 1) == events)
        try await reopened.closeCycle(
            CycleClosure(
                processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil,
                nextCycle: StoredCycle(number: 2, checkpoint: 0, openedAt: Date(timeIntervalSince1970: 1)), retention: 2))
        #expect(!FileManager.default.fileExists(atPath: spool.appendingPathComponent("p/1").path))
        #expect(try await reopened.secureAggregationEvents(processID: "p", cycle: 1).isEmpty)
    }

    @Test func aMaskedInputForAClosedCycleLeavesNoFile() async throws {
        let store = try await openStore(workers: 1)
        await #expect(throws: StoreError.self) {
            try await store.appendSecureAggregationEvent(
                StoredSecureAggregationEvent(sequence: 0, body: [0], words: [1, 2, 3, 4]), processID: "p", cycle: 5, reportedWorker: nil)
        }
        let closed = spool.appendingPathComponent("p/5")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: closed.path)) ?? []).isEmpty)
    }
}

/// Collects pending diffs from the store's `@Sendable` callback.
private final class Collected: @unchecked Sendable {
    private let lock = NSLock()
    private var diffs: [String: [UInt8]] = [:]

    func add(_ worker: String, _ diff: [UInt8]) {
        lock.lock()
        defer { lock.unlock() }
        diffs[worker] = diff
    }

    var value: [String: [UInt8]] {
        lock.lock()
        defer { lock.unlock() }
        return diffs
    }
}
