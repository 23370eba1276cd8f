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

    /// A manifest's accessed-API categories and reasons, after checking it has Apple's keys only.
    static func declared(in module: String) throws -> [String: [String]] {
        let data = try Data(contentsOf: sources.appendingPathComponent("\(module)/PrivacyInfo.xcprivacy"))
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
            let allowed = try #require(reasons[category], "unknown category \(category)")
            #expect(!given.isEmpty && given.allSatisfy(allowed.contains), "\(category): \(given)")
            declared[category] = given
        }
        return declared
    }

    @Test func theManifestsAreValidPlistsWithApplesKeysAndReasons() throws {
        let client = try Self.declared(in: "OrchardClient")
        #expect(client["NSPrivacyAccessedAPICategoryFileTimestamp"] == ["C617.1"], "metadata of files in the app's container")
        #expect(client["NSPrivacyAccessedAPICategorySystemBootTime"] == ["35F9.1"], "elapsed time between in-app events")
        #expect(try Self.declared(in: "OrchardData") == ["NSPrivacyAccessedAPICategoryFileTimestamp": ["C617.1"]])
    }

    /// The required-reason APIs (Apple's list) called by each module an app links are declared in that module's own
    /// manifest (an app links modules one by one; the OrchardClient manifest does not cover OrchardData's calls).
    @Test func everyRequiredReasonAPIThatAppLinkedModulesCallIsDeclaredByTheModule() throws {
        let apis: [(pattern: String, category: String)] = [
            ("attributesOfItem", "NSPrivacyAccessedAPICategoryFileTimestamp"), ("modificationDate", "NSPrivacyAccessedAPICategoryFileTimestamp"),
            ("creationDate", "NSPrivacyAccessedAPICategoryFileTimestamp"), ("stat(", "NSPrivacyAccessedAPICategoryFileTimestamp"),
            ("systemUptime", "NSPrivacyAccessedAPICategorySystemBootTime"), ("mach_absolute_time", "NSPrivacyAccessedAPICategorySystemBootTime"),
            ("volumeAvailableCapacity", "NSPrivacyAccessedAPICategoryDiskSpace"), ("statfs", "NSPrivacyAccessedAPICategoryDiskSpace"),
            ("UserDefaults", "NSPrivacyAccessedAPICategoryUserDefaults"), ("activeInputModes", "NSPrivacyAccessedAPICategoryActiveKeyboards"),
        ]
        let appLinked = [
            "OrchardSupport", "OrchardFormats", "OrchardML", "OrchardData", "OrchardProtocol", "OrchardPrivacy", "OrchardScheduler", "OrchardClient",
            "OrchardSchedulerApple", "OrchardCoreML", "OrchardCoreMLTrainer",
        ]
        var calling: [String: Set<String>] = [:]
        for module in appLinked {
            let directory = Self.sources.appendingPathComponent(module)
            let files =
                FileManager.default.enumerator(at: directory, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" }
                ?? []
            #expect(!files.isEmpty, "\(module) has sources")
            for file in files {
                let text = try String(contentsOf: file, encoding: .utf8)
                for api in apis where text.contains(api.pattern) { calling[module, default: []].insert(api.category) }
            }
        }
        #expect(calling["OrchardClient"] != nil && calling["OrchardData"] != nil, "the scan finds the calls it is meant to")
        for (module, categories) in calling {
            let declared = try Self.declared(in: module)
            for category in categories {
                #expect(declared[category] != nil, "\(module) calls a \(category) API: declare it in \(module)/PrivacyInfo.xcprivacy")
            }
        }
    }
}
