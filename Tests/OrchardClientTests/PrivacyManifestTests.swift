import Foundation
import Testing

/// The SDK's privacy manifest (`Sources/OrchardClient/PrivacyInfo.xcprivacy`), which App Store Connect reads from the
/// SDK's resource bundle: a property list with Apple's keys only (an unexpected key or value gets an app rejected),
/// each accessed-API category with one of its documented reasons, and every required-reason API the SDK's sources call
/// declared.
@Suite struct PrivacyManifestTests {
    static let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources")

    /// Apple's categories and the reasons a third-party SDK like this one may give (developer.apple.com,
    /// "Describing use of required reason API").
    static let reasons: [String: Set<String>] = [
        "NSPrivacyAccessedAPICategoryFileTimestamp": ["DDA9.1", "C617.1", "3B52.1", "0A2A.1"],
        "NSPrivacyAccessedAPICategorySystemBootTime": ["35F9.1", "8FFB.1", "3D61.1"],
        "NSPrivacyAccessedAPICategoryDiskSpace": ["85F4.1", "E174.1", "7D9E.1", "B728.1"],
        "NSPrivacyAccessedAPICategoryUserDefaults": ["CA92.1", "1C8F.1", "C56D.1", "AC6B.1"],
        "NSPrivacyAccessedAPICategoryActiveKeyboards": ["3EC4.1", "54BD.1"],
    ]

    @Test func theManifestIsAValidPlistWithApplesKeysAndReasons() throws {
        let data = try Data(contentsOf: Self.sources.appendingPathComponent("OrchardClient/PrivacyInfo.xcprivacy"))
        let manifest = try #require(try PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any])
        #expect(Set(manifest.keys) == ["NSPrivacyTracking", "NSPrivacyTrackingDomains", "NSPrivacyCollectedDataTypes", "NSPrivacyAccessedAPITypes"])
        #expect(manifest["NSPrivacyTracking"] as? Bool == false)
        #expect((manifest["NSPrivacyTrackingDomains"] as? [Any])?.isEmpty == true)
        #expect((manifest["NSPrivacyCollectedDataTypes"] as? [Any])?.isEmpty == true, "the SDK sends nothing to anyone but the app's own coordinator")
        let accessed = try #require(manifest["NSPrivacyAccessedAPITypes"] as? [[String: Any]])
        var declared: [String: [String]] = [:]
        for entry in accessed {
            #expect(Set(entry.keys) == ["NSPrivacyAccessedAPIType", "NSPrivacyAccessedAPITypeReasons"])
            let category = try #require(entry["NSPrivacyAccessedAPIType"] as? String)
            let given = try #require(entry["NSPrivacyAccessedAPITypeReasons"] as? [String])
            let allowed = try #require(Self.reasons[category], "unknown category \(category)")
            #expect(!given.isEmpty && given.allSatisfy(allowed.contains), "\(category): \(given)")
            declared[category] = given
        }
        #expect(declared["NSPrivacyAccessedAPICategoryFileTimestamp"] == ["C617.1"], "metadata of files in the app's container")
        #expect(declared["NSPrivacyAccessedAPICategorySystemBootTime"] == ["35F9.1"], "elapsed time between in-app events")
    }

    /// The required-reason APIs (Apple's list) called by the modules an app links, with the category that declares them.
    @Test func everyRequiredReasonAPIThatAppLinkedModulesCallIsDeclared() throws {
        let apis: [(pattern: String, category: String)] = [
            ("attributesOfItem", "NSPrivacyAccessedAPICategoryFileTimestamp"), ("modificationDate", "NSPrivacyAccessedAPICategoryFileTimestamp"),
            ("creationDate", "NSPrivacyAccessedAPICategoryFileTimestamp"), ("systemUptime", "NSPrivacyAccessedAPICategorySystemBootTime"),
            ("mach_absolute_time", "NSPrivacyAccessedAPICategorySystemBootTime"), ("volumeAvailableCapacity", "NSPrivacyAccessedAPICategoryDiskSpace"),
            ("statfs", "NSPrivacyAccessedAPICategoryDiskSpace"), ("UserDefaults", "NSPrivacyAccessedAPICategoryUserDefaults"),
            ("activeInputModes", "NSPrivacyAccessedAPICategoryActiveKeyboards"),
        ]
        let appLinked = ["OrchardSupport", "OrchardFormats", "OrchardML", "OrchardProtocol", "OrchardPrivacy", "OrchardScheduler", "OrchardClient", "OrchardSchedulerApple", "OrchardCoreML", "OrchardCoreMLTrainer"]
        let data = try Data(contentsOf: Self.sources.appendingPathComponent("OrchardClient/PrivacyInfo.xcprivacy"))
        let manifest = String(decoding: data, as: UTF8.self)
        for module in appLinked {
            let directory = Self.sources.appendingPathComponent(module)
            let files = FileManager.default.enumerator(at: directory, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" } ?? []
            #expect(!files.isEmpty, "\(module) has sources")
            for file in files {
                let text = try String(contentsOf: file, encoding: .utf8)
                for api in apis where text.contains(api.pattern) {
                    #expect(manifest.contains(api.category), "\(file.lastPathComponent) calls \(api.pattern): declare \(api.category)")
                }
            }
        }
    }
}
