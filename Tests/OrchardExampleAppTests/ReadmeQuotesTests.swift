import Foundation
import Testing

/// The README's "In an iOS app" quotes the example app instead of carrying code of its own: every Swift block there that
/// names a file of `Examples/OrchardExampleApp` on its first line must appear in that file, line for line.
@Suite struct ReadmeQuotesTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test func theIOSGuideQuotesTheCompiledExample() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let section = try #require(readme.range(of: "### In an iOS app")).upperBound
        let end = readme.range(of: "\n### ", range: section..<readme.endIndex)?.lowerBound ?? readme.endIndex
        let guide = readme[section..<end]
        let blocks = guide.components(separatedBy: "```swift\n").dropFirst().map { $0.components(separatedBy: "\n```")[0] }
        #expect(blocks.count >= 4, "the guide quotes the app, its delegate, the job and the samples")
        for block in blocks {
            var lines = block.components(separatedBy: "\n")
            let header = lines.removeFirst()
            #expect(header.hasPrefix("// Examples/OrchardExampleApp/"), "a block that is not quoted from the example: \(header)")
            guard header.hasPrefix("// ") else { continue }
            let file = try String(contentsOf: Self.root.appendingPathComponent(String(header.dropFirst(3))), encoding: .utf8)
            #expect(file.contains(lines.joined(separator: "\n")), "the README's quote of \(header.dropFirst(3)) differs from the file")
        }
    }
}
