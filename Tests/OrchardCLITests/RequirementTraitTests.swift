import Foundation
import Testing

/// `PythonModules.require(x)` in a test's body must sit under `PythonModules.requirement(x)` on the test or its suite:
/// without the trait, a machine with only Swift (the README's `swift test`) fails the test instead of skipping it.
@Suite struct RequirementTraitTests {
    static let tests = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()

    /// The argument text of each `name(…)` call on a line (one level of parentheses or brackets inside is enough here).
    static func arguments(of name: String, in line: Substring) -> [String] {
        var found: [String] = []
        var rest = line[...]
        while let range = rest.range(of: name + "(") {
            var depth = 1
            var index = range.upperBound
            while index < rest.endIndex, depth > 0 {
                if rest[index] == "(" { depth += 1 } else if rest[index] == ")" { depth -= 1 }
                index = rest.index(after: index)
            }
            found.append(String(rest[range.upperBound..<rest.index(before: index)]))
            rest = rest[index...]
        }
        return found
    }

    /// The places in `text` where a `require(x)` is not covered by a `requirement(x)` trait on the nearest `@Test`
    /// above it or on a `@Suite` above that.
    static func uncovered(in text: String) -> [(line: Int, modules: String)] {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        var result: [(Int, String)] = []
        for (number, line) in lines.enumerated() {
            for modules in arguments(of: "PythonModules.require", in: line) where !line.contains("#expect") {
                var covered = false
                var sawTest = false
                for above in lines[..<number].reversed() {
                    let trimmed = above.trimmingCharacters(in: .whitespaces)
                    let isTest = trimmed.hasPrefix("@Test"), isSuite = trimmed.hasPrefix("@Suite")
                    guard isTest || isSuite else { continue }
                    if isTest {
                        if sawTest { continue }  // another test's trait does not cover this one
                        sawTest = true
                    }
                    if arguments(of: "PythonModules.requirement", in: above).contains(where: { $0.hasPrefix(modules) }) {
                        covered = true
                        break
                    }
                }
                if !covered { result.append((number + 1, modules)) }
            }
        }
        return result
    }

    @Test func everyRequirementSitsUnderItsTrait() throws {
        let files = (FileManager.default.enumerator(at: Self.tests, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL } ?? [])
            .filter { $0.pathExtension == "swift" && $0.lastPathComponent != "RequirementTraitTests.swift" }
        var checked = 0
        for file in files {
            let text = try String(contentsOf: file, encoding: .utf8)
            checked += text.components(separatedBy: "PythonModules.require(").count - 1
            for place in Self.uncovered(in: text) {
                Issue.record(
                    "\(file.lastPathComponent):\(place.line): PythonModules.require(\(place.modules)) without PythonModules.requirement(\(place.modules)) on its test or suite"
                )
            }
        }
        #expect(checked >= 5, "the scan finds the requirements it is meant to check")
    }

    @Test func theCheckFindsARequirementWithoutItsTrait() {
        let bare = """
            @Suite struct S {
                @Test func a() throws {
                    try PythonModules.require(["coremltools"])
                }
                @Test(PythonModules.requirement(["numpy"])) func b() throws {
                    try PythonModules.require(["numpy"])
                }
            }
            """
        #expect(Self.uncovered(in: bare).map(\.line) == [3])
        let suite = """
            @Suite(PythonModules.requirement(["numpy"])) struct S {
                @Test func a() throws { try PythonModules.require(["numpy"]) }
            }
            """
        #expect(Self.uncovered(in: suite).isEmpty)
    }
}
