public import Foundation
public import Testing
import Synchronization

/// Python packages that cross-check tests run through `python3`: a test that needs them is skipped, with the
/// install command as its reason, when they are missing, unless `ORCHARD_REQUIRE_PYTHON=1` is set (CI), in which
/// case it runs and a missing package fails it.
///
/// ```swift
/// @Suite(PythonModules.requirement(["numpy", "safetensors"]))
/// struct PythonTests {
///     @Test func check() throws {
///         try PythonModules.require(["numpy", "safetensors"])
///         …
///     }
/// }
/// ```
public enum PythonModules {
    /// The environment variable that turns a missing package from a skip into a failure.
    public static let requireVariable = "ORCHARD_REQUIRE_PYTHON"

    /// A module `python3` could not import, and why.
    public struct Missing: Sendable, Hashable, CustomStringConvertible {
        /// The module's import name.
        public var module: String
        /// Python's last error line, or why `python3` could not start.
        public var reason: String

        public var description: String { "\(module) (\(reason))" }
    }

    /// The error a required but missing module throws (after recording an issue).
    public struct Unavailable: Error, Sendable, Hashable, CustomStringConvertible {
        /// The modules that are missing.
        public var missing: [Missing]
        public var description: String {
            "python3 cannot import \(missing.map(\.description).joined(separator: ", ")); \(PythonModules.installHint(missing.map(\.module)))"
        }
    }

    private static let cache = Mutex<[String: Missing?]>([:])

    /// Whether `ORCHARD_REQUIRE_PYTHON=1` is set in `environment` (the process's by default).
    public static func isRequired(in environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        environment[requireVariable] == "1"
    }

    /// The modules of `modules` that `python3` cannot import (each tried once per process, then cached).
    public static func missing(_ modules: [String]) -> [Missing] {
        modules.compactMap { module in
            if let cached = cache.withLock({ $0[module] }) { return cached }
            let result = probe(module)
            cache.withLock { $0[module] = .some(result) }
            return result
        }
    }

    /// Whether `python3` can import every module of `modules`.
    public static func available(_ modules: [String]) -> Bool { missing(modules).isEmpty }

    /// The command that installs `modules`.
    public static func installHint(_ modules: [String]) -> String {
        "install with `python3 -m pip install \(modules.joined(separator: " "))`"
    }

    /// A condition trait for a test or suite needing `modules`: enabled when they import or when
    /// `ORCHARD_REQUIRE_PYTHON=1` is set; otherwise disabled with a comment naming what is missing and how to
    /// install it.
    public static func requirement(_ modules: [String], environment: [String: String] = ProcessInfo.processInfo.environment) -> ConditionTrait {
        let missing = missing(modules)
        let runs = missing.isEmpty || isRequired(in: environment)
        let comment =
            missing.isEmpty
            ? "needs Python's \(modules.joined(separator: ", ")), which import"
            : "python3 cannot import \(missing.map(\.description).joined(separator: ", ")); \(installHint(missing.map(\.module))), or set \(requireVariable)=1 to make this a failure"
        return .enabled(if: runs, Comment(rawValue: comment))
    }

    /// Throws ``Unavailable``, naming each missing module and the install command, when any of `modules` cannot
    /// be imported; Swift Testing records it as the test's issue. Call it first in a test guarded by
    /// ``requirement(_:environment:)``.
    public static func require(_ modules: [String]) throws(Unavailable) {
        let missing = missing(modules)
        guard missing.isEmpty else { throw Unavailable(missing: missing) }
    }

    /// Tries `python3 -c "import <module>"`; nil when it imports.
    private static func probe(_ module: String) -> Missing? {
        guard module.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" || $0 == "." }), !module.isEmpty else {
            return Missing(module: module, reason: "not a Python module name")
        }
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", "import \(module)"]
        let errors = Pipe()
        process.standardOutput = FileHandle.nullDevice
        process.standardError = errors
        do {
            try process.run()
        } catch {
            return Missing(module: module, reason: "python3 could not be started: \(error)")
        }
        let data = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus != 0 else { return nil }
        if process.terminationStatus == 127 { return Missing(module: module, reason: "python3 is not installed") }
        let last = String(decoding: data, as: UTF8.self).split(separator: "\n").last.map(String.init) ?? "exit status \(process.terminationStatus)"
        return Missing(module: module, reason: last)
    }
}
