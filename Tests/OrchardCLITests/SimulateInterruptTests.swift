import Foundation
#if canImport(Glibc)
import Glibc
#endif
import OrchardTesting
import Testing

/// Ctrl-C during `orchard simulate` (the built executable, a real SIGINT): the rounds run so far are reported, the
/// temporary coordinator directory is removed, and the exit status says the run was interrupted.
@Suite struct SimulateInterruptTests {
    @Test func anInterruptedSimulationWritesWhatItMeasuredAndCleansUp() async throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-interrupt-\(UUID().uuidString)")
        let output = scratch.appendingPathComponent("report")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }
        let process = ChildProcess()
        process.executableURL = try OrchardExecutable.url()
        process.arguments = ["simulate", "--rounds", "500", "--transport", "memory", "--output", output.path]
        var environment = ProcessInfo.processInfo.environment
        environment["TMPDIR"] = scratch.path  // the run's coordinator directory goes here
        process.environment = environment
        let errors = Pipe(), out = Pipe()
        process.standardError = errors
        process.standardOutput = out
        let ended = AsyncStream<Int32>.makeStream()
        process.terminationHandler = { ended.continuation.yield($0.terminationStatus) }
        try process.run()
        // Wait for the first round to be reported on standard error, then interrupt as Ctrl-C does.
        var seen = ""
        while !seen.contains("round 1/500") {
            let chunk = await errors.fileHandleForReading.nextAvailableData()
            if chunk.isEmpty { break }
            seen += String(decoding: chunk, as: UTF8.self)
        }
        #expect(seen.contains("round 1/500"), "\(seen)")
        kill(process.processIdentifier, SIGINT)
        var statuses = ended.stream.makeAsyncIterator()
        let status = await statuses.next()
        let printed = String(decoding: await out.fileHandleForReading.readToEndOfFile(), as: UTF8.self)
        seen += String(decoding: await errors.fileHandleForReading.readToEndOfFile(), as: UTF8.self)
        #expect(status == 130, "\(seen)")
        #expect(seen.contains("interrupted: finishing the round in progress"))
        #expect(printed.contains("note: stopped after"), "\(printed)")
        // The report covers the rounds run.
        let summary = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: output.appendingPathComponent("summary.json"))) as? [String: Any])
        let rounds = try #require(summary["rounds"] as? Int)
        #expect(rounds >= 1 && rounds < 500)
        #expect(summary["planned_rounds"] as? Int == 500)
        let lines = try String(contentsOf: output.appendingPathComponent("metrics.jsonl"), encoding: .utf8).split(separator: "\n")
        #expect(lines.count == rounds)
        #expect(FileManager.default.fileExists(atPath: output.appendingPathComponent("report.html").path))
        // Nothing left of the run's coordinator and devices.
        let left = try FileManager.default.contentsOfDirectory(atPath: scratch.path).filter { $0.hasPrefix("orchard-simulate-") }
        #expect(left.isEmpty, "\(left)")
    }
}
