import Foundation
import Testing

/// The iOS guide (the OrchardClient documentation's "Building an iOS app" article) quotes the example app instead of
/// carrying code of its own: every Swift block there must name a file of `Examples/OrchardExampleApp` on its first line
/// and appear in that file, line for line.
@Suite struct IOSGuideQuotesTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let guide = "Sources/OrchardClient/OrchardClient.docc/BuildingAnIOSApp.md"

    @Test func theIOSGuideQuotesTheCompiledExample() throws {
        let guide = try String(contentsOf: Self.root.appendingPathComponent(Self.guide), encoding: .utf8)
        let blocks = guide.components(separatedBy: "```swift\n").dropFirst().map { $0.components(separatedBy: "\n```")[0] }
        #expect(blocks.count >= 4, "the guide quotes the app, its delegate, the job and the samples")
        for block in blocks {
            var lines = block.components(separatedBy: "\n")
            let header = lines.removeFirst()
            #expect(header.hasPrefix("// Examples/OrchardExampleApp/"), "a block that is not quoted from the example: \(header)")
            guard header.hasPrefix("// ") else { continue }
            let file = try String(contentsOf: Self.root.appendingPathComponent(String(header.dropFirst(3))), encoding: .utf8)
            #expect(file.contains(lines.joined(separator: "\n")), "the guide's quote of \(header.dropFirst(3)) differs from the file")
        }
    }
}
