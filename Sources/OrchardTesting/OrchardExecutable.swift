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
