import Foundation
import Testing

/// The shims stand in for Apple's frameworks, which have no simulation hooks: the hooks are SPI
/// (`@_spi(AppleShimTesting)`), imported only by the testing module and tests. Code an app links that used one would
/// compile on Linux and not on an iPhone.
@Suite struct AppleShimBoundaryTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static func swiftFiles(under folder: String) -> [URL] {
        let directory = root.appendingPathComponent(folder)
        return (FileManager.default.enumerator(at: directory, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL } ?? [])
            .filter { $0.pathExtension == "swift" }
    }

    @Test func onlyTheTestingModuleAndTestsImportTheShimsSPI() throws {
        let allowed = ["Sources/AppleShims/Testing/", "Sources/AppleShims/SwiftUI/"]  // SwiftUI's launch ends BGTaskScheduler's
        var offenders: [String] = []
        for folder in ["Sources", "Examples"] {
            for file in Self.swiftFiles(under: folder) {
                let path = file.path.replacingOccurrences(of: Self.root.path + "/", with: "")
                guard !allowed.contains(where: path.hasPrefix) else { continue }
                if try String(contentsOf: file, encoding: .utf8).contains("@_spi(AppleShimTesting) ") { offenders.append(path) }
            }
        }
        #expect(offenders.filter { !$0.hasPrefix("Sources/AppleShims/") }.isEmpty, "\(offenders)")
        #expect(!Self.swiftFiles(under: "Sources").isEmpty && !Self.swiftFiles(under: "Examples").isEmpty)
    }

    @Test func theFrameworkNamedShimsDeclareNothingPackageWide() throws {
        // `package` members would reach every target of the package, Apple-facing code included.
        for module in ["BackgroundTasks", "CoreML", "UIKit", "Network", "OSLog", "SwiftUI"] {
            for file in Self.swiftFiles(under: "Sources/AppleShims/\(module)") {
                let text = try String(contentsOf: file, encoding: .utf8)
                let lines = text.split(separator: "\n").filter { $0.trimmingCharacters(in: .whitespaces).hasPrefix("package ") }
                #expect(lines.isEmpty, "\(file.lastPathComponent): \(lines)")
            }
        }
    }
}
