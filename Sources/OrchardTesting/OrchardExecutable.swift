public import Foundation

/// The `orchard` command-line executable of the current build, for tests that run it as a child process.
public enum OrchardExecutable {
    /// Why the executable could not be found.
    public struct NotFound: Error, CustomStringConvertible {
        /// The paths looked at.
        public var candidates: [String]
        public var description: String { "the orchard executable was not found next to the test bundle (looked at \(candidates))" }
    }

    /// The `orchard` executable built next to the running test bundle.
    public static func url() throws -> URL {
        var candidates: [URL] = []
        let argument0 = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var directory = argument0.deletingLastPathComponent()
        for _ in 0..<4 {
            candidates.append(directory.appendingPathComponent("orchard"))
            directory = directory.deletingLastPathComponent()
        }
        if let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            candidates.append(URL(fileURLWithPath: exe).deletingLastPathComponent().appendingPathComponent("orchard"))
        }
        guard let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0.path) && !$0.hasDirectoryPath }) else {
            throw NotFound(candidates: candidates.map(\.path))
        }
        return found
    }
}

extension OrchardExecutable {
    /// Reads `handle` (a child's standard output) until its first newline, blocking, and returns that line parsed as
    /// a JSON object: nil when the child ended first or the line is not a JSON object. `buffered` keeps every byte read.
    public static func firstJSONLine(_ handle: FileHandle, buffered: inout [UInt8]) -> [String: Any]? {
        while !buffered.contains(UInt8(ascii: "\n")) {
            let chunk = handle.availableData
            if chunk.isEmpty { return nil }
            buffered += chunk
        }
        return try? JSONSerialization.jsonObject(with: Data(buffered.prefix { $0 != UInt8(ascii: "\n") })) as? [String: Any]
    }

    /// The first line `orchard serve` printed, `{"event":"listening",…}`, and its port; nil when it ended first.
    public static func listeningPort(_ handle: FileHandle) -> (port: Int, line: [String: Any])? {
        var buffered: [UInt8] = []
        guard let line = firstJSONLine(handle, buffered: &buffered), let port = (line["port"] as? NSNumber)?.intValue else { return nil }
        return (port, line)
    }
}
