// swift-log into the unified log, as an iPhone compiles it (`import os`: on Linux the shim aliased by Package.swift),
// read back from the simulated log as Console.app shows it.
#if os(Linux)
import AppleShimTesting
import Foundation
import Logging
import OrchardSchedulerApple
import os
import Testing

@Suite struct OSLogHandlerTests {
    @Test func messagesReachTheUnifiedLogWithTheirLevelsAndPrivateMetadataRedacted() {
        let label = "dev.orchard.test.\(UUID().uuidString)"
        var logger = Logging.Logger(label: label) { OSLogHandler(label: $0) }
        logger.logLevel = .trace
        logger.info("cycle 3 assigned", metadata: ["process": "keyboard"])
        logger.debug("download resumed")
        logger.warning("conditions not met")
        logger.error("report refused")
        logger.critical("store damaged")
        logger.trace("trace")
        let entries = SimulatedSystem.unifiedLog.filter { $0.category == label }
        #expect(entries.map(\.subsystem) == Array(repeating: "dev.orchard", count: 6))
        #expect(entries.map(\.level) == [OSLogType.info, .debug, .default, .error, .fault, .debug])
        #expect(entries.first?.message == "cycle 3 assigned <private>", "metadata is private unless asked otherwise")
        #expect(entries.dropFirst().first?.message == "download resumed")
    }

    @Test func publicMetadataAndTheHandlersLevelAndMetadata() {
        let label = "dev.orchard.test.\(UUID().uuidString)"
        var logger = Logging.Logger(label: label) { OSLogHandler(label: $0, subsystem: "com.example.app", metadataIsPublic: true) }
        logger[metadataKey: "device"] = "phone-1"
        logger.debug("below the default level: not written")
        logger.notice("window opened", metadata: ["task": "train"])
        let entries = SimulatedSystem.unifiedLog.filter { $0.category == label }
        #expect(entries.count == 1)
        #expect(entries.first?.subsystem == "com.example.app")
        #expect(entries.first?.level == .default)
        #expect(entries.first?.message == "window opened device=phone-1 task=train")
    }
}
#endif
