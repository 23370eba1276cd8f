import Foundation
import OrchardSupport
import OrchardTesting
import Testing

/// What a ``ProgressMeter`` writes for a sequence of (units done, seconds since the start) events.
@Suite struct ProgressMeterTests {
    /// Feeds `events` to `meter` and collects every text it returns.
    func texts(_ meter: inout ProgressMeter, _ events: [(Int, Double)], detail: String = "") -> [String] {
        events.compactMap { meter.update($0.0, detail: detail, at: $0.1) }
    }

    @Test func plainLinesComeEveryTenPerCentButAtMostOnceASecond() {
        var slow = ProgressMeter("bench gemm", total: 100, unit: "runs", style: .plain)
        // A unit every 1/4 s: 10 % takes 2.5 s, so a line comes every 10 %.
        let percents = texts(&slow, (1...100).map { ($0, Double($0) / 4) }).map { $0.prefix { $0 != "%" } }
        #expect(percents == (1...10).map { "bench gemm: \($0 * 10)" })
        var fast = ProgressMeter("bench gemm", total: 100, unit: "runs", style: .plain)
        // A unit every 1/16 s: 10 % takes 0.625 s, so a line comes every second (16 units), and one at the end.
        #expect(
            texts(&fast, (1...100).map { ($0, Double($0) / 16) }) == [
                "bench gemm: 16% (16/100 runs), 1.0 s\n",
                "bench gemm: 32% (32/100 runs), 2.0 s\n",
                "bench gemm: 48% (48/100 runs), 3.0 s\n",
                "bench gemm: 64% (64/100 runs), 4.0 s\n",
                "bench gemm: 80% (80/100 runs), 5.0 s\n",
                "bench gemm: 96% (96/100 runs), 6.0 s\n",
                "bench gemm: 100% (100/100 runs), 6.3 s\n",
            ])
    }

    @Test func aSlowJobGetsAPlainLineAtLeastEveryTenSecondsWhileItAdvances() {
        var meter = ProgressMeter("train housing", total: 1000, unit: "epochs", style: .plain)
        // 1 % every 4 s: a 10 % step takes 40 s, so the 10-second heartbeat speaks first.
        let lines = texts(&meter, (1...10).map { ($0 * 10, Double($0) * 4) }, detail: "central model")
        #expect(
            lines == [
                "train housing: 3% (30/1000 epochs), central model, 12.0 s\n",
                "train housing: 6% (60/1000 epochs), central model, 24.0 s\n",
                "train housing: 9% (90/1000 epochs), central model, 36.0 s\n",
            ])
        // Standing still says nothing, however long it takes.
        #expect(meter.update(100, at: 100) == nil)
        #expect(meter.update(100, at: 200) == nil)
    }

    @Test func aJobShorterThanASecondWritesNoPlainLine() {
        var meter = ProgressMeter("bench gemm", total: 4, unit: "runs", style: .plain)
        #expect(texts(&meter, [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]).isEmpty)
    }

    @Test func theTerminalLineIsRedrawnAtMostTenTimesASecondAndClearedAtTheEnd() {
        var meter = ProgressMeter("bench train", total: 4, unit: "epochs", style: .terminal(width: 200))
        let texts = texts(&meter, [(1, 0.01), (2, 0.05), (3, 0.2), (4, 0.3)], detail: "warm-up")
        #expect(
            texts == [
                "\r\u{1B}[2Kbench train  [██████░░░░░░░░░░░░░░░░░░]   25%  1/4 epochs  0.0 s  warm-up",
                "\r\u{1B}[2Kbench train  [██████████████████░░░░░░]   75%  3/4 epochs  0.2 s  warm-up",
                "\r\u{1B}[2K",
            ])
        #expect(!meter.isDrawn)
        #expect(meter.update(4, at: 1) == nil, "nothing after completion")
        #expect(meter.interruption() == nil)
    }

    @Test func theTerminalLineFitsTheTerminalAndAnEarlyStopEndsIt() {
        var meter = ProgressMeter("train housing", total: 300, unit: "epochs", style: .terminal(width: 40))
        let text = meter.update(3, detail: "central model, loss 12.3", at: 65)
        #expect(text == "\r\u{1B}[2K" + "train housing  [░░░░░░░░░░░░░░░░░░░░░░░")
        #expect(meter.isDrawn)
        #expect(meter.interruption() == "\n")
        #expect(meter.interruption() == nil)
    }

    @Test func longJobsShowMinutesAndHours() {
        var meter = ProgressMeter("x", total: 2, unit: "steps", style: .plain)
        #expect(meter.update(1, at: 125) == "x: 50% (1/2 steps), 2 min 05 s\n")
        #expect(meter.update(2, at: 3725) == "x: 100% (2/2 steps), 1 h 02 min\n")
    }

    @Test func aReporterWritesTheMetersTextAndEndsALineLeftDrawn() {
        final class Sink: @unchecked Sendable { var text = "" }
        let sink = Sink()
        do {
            let reporter = ProgressReporter(ProgressMeter("job", total: 10, unit: "steps", style: .terminal(width: 80))) { sink.text += $0 }
            reporter.update(1)
        }
        #expect(sink.text.hasPrefix("\r\u{1B}[2Kjob  ["))
        #expect(sink.text.hasSuffix("\n"), "the reporter went away mid-job: the line is ended")
    }
}

@Suite struct LocalFileTests {
    /// A new empty directory under the temporary directory, named `prefix` and a UUID (the caller removes it).
    static func scratchDirectory(_ prefix: String) throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    @Test func aMissingFileADirectoryAndAMissingDirectoryAreNamedInAFewWords() throws {
        let directory = try Self.scratchDirectory("orchard-local-file")
        defer { try? FileManager.default.removeItem(at: directory) }
        let missing = directory.appendingPathComponent("nope.json").path
        #expect(throws: FileAccessError(.noSuchFile, "no such file")) { try LocalFile.read(missing) }
        #expect(throws: FileAccessError(.isADirectory, "is a directory")) { try LocalFile.read(directory.path) }
        #expect(throws: FileAccessError(.noSuchFile, "no such directory")) {
            try LocalFile.write(Data("x".utf8), to: directory.appendingPathComponent("no/such/out.json").path)
        }
        #expect(throws: FileAccessError(.isADirectory, "is a directory")) { try LocalFile.write(Data(), to: directory.path) }

        let file = directory.appendingPathComponent("a.txt").path
        try LocalFile.write(Data("hello".utf8), to: file)
        #expect(try LocalFile.read(file) == Data("hello".utf8))
        #expect(throws: FileAccessError(.failed, "is a file, not a directory")) { try LocalFile.createDirectory(file) }
        try LocalFile.createDirectory(directory.appendingPathComponent("b/c").path)
        try LocalFile.createDirectory(directory.appendingPathComponent("b/c").path)
        #expect(FileManager.default.fileExists(atPath: directory.appendingPathComponent("b/c").path))
        #expect(throws: FileAccessError(.failed, "a parent is a file, not a directory")) {
            try LocalFile.createDirectory(directory.appendingPathComponent("a.txt/d").path)
        }
    }

    @Test("spreadSubdirectories sets the top-directory attribute where the file system has it, and says so")
    func spreadSubdirectories() async throws {
        let directory = try Self.scratchDirectory("orchard-spread")
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("a.txt").path
        try LocalFile.write(Data("x".utf8), to: file)
        #expect(!LocalFile.spreadSubdirectories(of: directory.appendingPathComponent("missing").path))
        #expect(!LocalFile.spreadSubdirectories(of: file), "a file is not a directory")
        let set = LocalFile.spreadSubdirectories(of: directory.path)
        #expect(LocalFile.spreadSubdirectories(of: directory.path) == set, "setting it again agrees")
        // Where e2fsprogs' lsattr can read the attributes, they agree with the answer: `T` is the top-directory flag.
        let lsattr = "/usr/bin/lsattr"
        guard FileManager.default.isExecutableFile(atPath: lsattr) else { return }
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: lsattr)
        process.arguments = ["-d", directory.path]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let text = String(decoding: await output.fileHandleForReading.readToEndOfFile(), as: UTF8.self)
        await process.exited()
        if process.terminationStatus == 0 {
            let attributes = text.split(separator: " ").first.map(String.init) ?? ""
            #expect(attributes.contains("T") == set, "lsattr shows \(attributes)")
        } else {
            #expect(!set, "lsattr cannot read this file system's attributes, so the hint cannot have been set")
        }
    }

    @Test("replace writes atomically through a .writing file, synced or not, and leaves nothing behind on failure")
    func replaceIsAtomic() throws {
        let directory = try Self.scratchDirectory("orchard-replace")
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("state.json").path
        for (synced, text) in [(true, "first"), (false, "second, longer than the first"), (false, "3")] {
            try LocalFile.replace(Data(text.utf8), at: file, synced: synced)
            #expect(try LocalFile.read(file) == Data(text.utf8))
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["state.json"])
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? NSNumber)
        #expect(mode.intValue & 0o777 == 0o600)
        #expect(throws: FileAccessError(.noSuchFile, "no such directory")) {
            try LocalFile.replace(Data("x".utf8), at: directory.appendingPathComponent("no/such.json").path, synced: false)
        }
        // Over a directory: the rename fails, the directory stays, and the temporary file is removed.
        try LocalFile.createDirectory(directory.appendingPathComponent("sub").path)
        #expect(throws: FileAccessError(.isADirectory, "is a directory")) {
            try LocalFile.replace(Data("x".utf8), at: directory.appendingPathComponent("sub").path, synced: false)
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted() == ["state.json", "sub"])
        // A complete file promoted over another, synced or not; a missing one is named.
        for synced in [true, false] {
            let partial = directory.appendingPathComponent("model.partial").path
            try LocalFile.replace(Data("model \(synced)".utf8), at: partial, synced: false)
            try LocalFile.promote(partial, to: file, synced: synced)
            #expect(try LocalFile.read(file) == Data("model \(synced)".utf8))
            #expect(!FileManager.default.fileExists(atPath: partial))
        }
        for synced in [true, false] {
            #expect(throws: FileAccessError(.noSuchFile, "no such file")) {
                try LocalFile.promote(directory.appendingPathComponent("gone").path, to: file, synced: synced)
            }
        }
    }

    @Test(.enabled(if: geteuid() != 0, "root reads every file"))
    func anUnreadableFileIsPermissionDenied() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-locked-\(UUID().uuidString)").path
        try LocalFile.write(Data("secret".utf8), to: file)
        defer { try? FileManager.default.removeItem(atPath: file) }
        try FileManager.default.setAttributes([.posixPermissions: 0o000], ofItemAtPath: file)
        #expect(throws: FileAccessError(.permissionDenied, "permission denied")) { try LocalFile.read(file) }
    }
}
