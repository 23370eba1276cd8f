// swift-log's messages in the unified log, where Console.app and `log stream` show them on Apple platforms (stderr,
// swift-log's default, is not kept on an iPhone). On Linux, `os` is the shim that Package.swift aliases to it.
public import os
public import Logging

/// A swift-log `LogHandler` that writes to Apple's unified log (`os.Logger`) under a subsystem, with the logger's
/// label as the category.
///
/// Bootstrap it once, early in the app's launch: `LoggingSystem.bootstrap { OSLogHandler(label: $0) }`. Levels map as
/// trace/debug → debug, info → info, notice/warning → default, error → error, critical → fault. Messages are logged as
/// public (Orchard's messages name processes, cycles and errors, not the device's data); metadata is appended as
/// `key=value` and is private unless ``metadataIsPublic`` is set, so Console shows `<private>` for it outside a
/// debugging session.
public struct OSLogHandler: LogHandler {
    /// The unified log's subsystem (reverse-DNS; `dev.orchard` by default).
    public let subsystem: String
    /// The logger's label, used as the category.
    public let label: String
    /// Whether metadata values are shown in Console (otherwise redacted as `<private>`).
    public var metadataIsPublic: Bool
    /// The lowest level written.
    public var logLevel: Logging.Logger.Level = .info
    /// Metadata added to every message.
    public var metadata: Logging.Logger.Metadata = [:]

    private let logger: os.Logger

    /// A handler for the logger labelled `label`.
    public init(label: String, subsystem: String = "dev.orchard", metadataIsPublic: Bool = false) {
        self.label = label
        self.subsystem = subsystem
        self.metadataIsPublic = metadataIsPublic
        self.logger = os.Logger(subsystem: subsystem, category: label)
    }

    /// Metadata for one key.
    public subscript(metadataKey key: String) -> Logging.Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes one message to the unified log.
    public func log(event: LogEvent) {
        let merged = event.metadata.map { metadata.merging($0) { $1 } } ?? metadata
        let text = event.error.map { "\(event.message) (\($0))" } ?? event.message.description
        let type = Self.type(of: event.level)
        if merged.isEmpty {
            logger.log(level: type, "\(text, privacy: .public)")
            return
        }
        let details = merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        if metadataIsPublic {
            logger.log(level: type, "\(text, privacy: .public) \(details, privacy: .public)")
        } else {
            logger.log(level: type, "\(text, privacy: .public) \(details, privacy: .private)")
        }
    }

    /// The unified log's level for a swift-log level.
    public static func type(of level: Logging.Logger.Level) -> OSLogType {
        switch level {
        case .trace, .debug: .debug
        case .info: .info
        case .notice, .warning: .default
        case .error: .error
        case .critical: .fault
        }
    }
}
