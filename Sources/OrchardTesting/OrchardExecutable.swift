public import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

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
    /// Reads `handle` (a child's standard output) until its first newline, on a thread of its own, and returns that
    /// line parsed as a JSON object: nil when the child ended first or the line is not a JSON object. `buffered` keeps
    /// every byte read.
    public static func firstJSONLine(_ handle: FileHandle, buffered: inout [UInt8]) async -> [String: Any]? {
        while !buffered.contains(UInt8(ascii: "\n")) {
            let chunk = await handle.nextAvailableData()
            if chunk.isEmpty { return nil }
            buffered += chunk
        }
        return try? JSONSerialization.jsonObject(with: Data(buffered.prefix { $0 != UInt8(ascii: "\n") })) as? [String: Any]
    }

    /// The first line `orchard serve` printed, `{"event":"listening",…}`, and its port; nil when it ended first.
    public static func listeningPort(_ handle: FileHandle) async -> (port: Int, line: [String: Any])? {
        var buffered: [UInt8] = []
        guard let line = await firstJSONLine(handle, buffered: &buffered), let port = (line["port"] as? NSNumber)?.intValue else { return nil }
        return (port, line)
    }
}

extension OrchardExecutable {
    /// One finished run of the executable: its exit status and what it wrote.
    public struct Run: Sendable {
        /// The exit status.
        public var status: Int32
        /// Standard output.
        public var output: String
        /// Standard error.
        public var error: String

        /// Creates a run.
        public init(status: Int32, output: String, error: String) {
            self.status = status
            self.output = output
            self.error = error
        }

        /// Standard error with every run of whitespace (the help's line wrapping) as one space.
        public var flatError: String { error.split(whereSeparator: \.isWhitespace).joined(separator: " ") }
        /// Standard output, likewise.
        public var flatOutput: String { output.split(whereSeparator: \.isWhitespace).joined(separator: " ") }
    }

    /// Runs `orchard arguments…` to its end in `directory` (a temporary one when nil), standard output and error
    /// captured in files there; `environment` is added to this process's (a nil value removes the variable).
    public static func run(_ arguments: [String], environment: [String: String?] = [:], in directory: URL? = nil) async throws -> Run {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-cli-\(UUID().uuidString)")
        let place = directory ?? scratch
        if directory == nil { try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true) }
        let outURL = place.appendingPathComponent("stdout-\(UUID().uuidString)"), errURL = place.appendingPathComponent("stderr-\(UUID().uuidString)")
        defer {
            try? FileManager.default.removeItem(at: outURL)
            try? FileManager.default.removeItem(at: errURL)
            if directory == nil { try? FileManager.default.removeItem(at: scratch) }
        }
        _ = FileManager.default.createFile(atPath: outURL.path, contents: nil)
        _ = FileManager.default.createFile(atPath: errURL.path, contents: nil)
        let process = ChildProcess()
        process.executableURL = try url()
        process.arguments = arguments
        process.currentDirectoryURL = place
        var merged = ProcessInfo.processInfo.environment
        for (key, value) in environment { merged[key] = value }
        process.environment = merged
        process.standardOutput = try FileHandle(forWritingTo: outURL)
        process.standardError = try FileHandle(forWritingTo: errURL)
        let status = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Int32, any Error>) in
            process.terminationHandler = { continuation.resume(returning: $0.terminationStatus) }
            do { try process.run() } catch {
                process.terminationHandler = nil
                continuation.resume(throwing: error)
            }
        }
        return Run(status: status, output: try String(contentsOf: outURL, encoding: .utf8), error: try String(contentsOf: errURL, encoding: .utf8))
    }
}

extension OrchardExecutable {
    /// `orchard serve` as a child process: started on `--port 0`, and ready once the first line on its standard output
    /// has announced the port it bound. Nothing here blocks a thread of the cooperative pool.
    public final class Server: Sendable {
        /// The child.
        public let process: ChildProcess
        /// The port it listens on.
        public let port: Int

        /// Why the server could not be started.
        public struct StartFailure: Error, CustomStringConvertible {
            /// What happened.
            public var description: String
        }

        private init(process: ChildProcess, port: Int) {
            self.process = process
            self.port = port
        }

        /// Starts `orchard serve --port 0 arguments…` with `environment` added to this process's, standard error
        /// inherited, and returns once it has announced its port.
        public static func start(_ arguments: [String], environment: [String: String]) async throws -> Server {
            let process = ChildProcess()
            process.executableURL = try OrchardExecutable.url()
            process.arguments = ["serve", "--port", "0"] + arguments
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
            let output = Pipe()
            process.standardOutput = output
            try process.run()
            guard let listening = await listeningPort(output.fileHandleForReading) else {
                process.terminate()
                throw StartFailure(description: "orchard serve ended without its listening line")
            }
            return Server(process: process, port: listening.port)
        }

        /// `http://127.0.0.1:<port>`.
        public var url: URL { URL(string: "http://127.0.0.1:\(port)")! }

        /// Kills it with SIGKILL and returns once it has ended.
        public func kill9() async {
            process.send(SIGKILL)
            await process.exited()
        }

        /// Sends SIGTERM while it runs (its reaper thread collects it).
        public func terminate() {
            if process.isRunning { process.terminate() }
        }
    }
}
