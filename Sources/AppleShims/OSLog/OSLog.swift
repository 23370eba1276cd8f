// The part of Apple's unified logging (`os.Logger`) that Orchard uses, for Linux: Orchard's Apple-facing targets import
// it as `os` (Package.swift aliases the module on Linux). Declarations are transcribed from the SDK's `os.swiftmodule`
// interface (Logger, OSLogType, OSLogMessage, OSLogPrivacy); see docs/apple-shims.md. Entries are kept in memory, where
// AppleShimTesting reads them: what Console.app would show.
#if os(Linux)  // Apple platforms have the real framework
import Foundation

/// `OSLogType`: the level of a log entry.
public struct OSLogType: Equatable, Hashable, RawRepresentable, Sendable {
    /// The level's raw value.
    public let rawValue: UInt8
    /// Creates a level.
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    /// The default level (what `Logger.notice` writes).
    public static let `default` = OSLogType(rawValue: 0x00)
    /// Information that may be helpful, not essential.
    public static let info = OSLogType(rawValue: 0x01)
    /// Debug-level messages, for development.
    public static let debug = OSLogType(rawValue: 0x02)
    /// Errors.
    public static let error = OSLogType(rawValue: 0x10)
    /// Faults: bugs in the program.
    public static let fault = OSLogType(rawValue: 0x11)
}

/// `OSLogPrivacy`: whether an interpolated value is shown in the log or redacted. As in the SDK, an interpolation's
/// `privacy:` must be one of these constants, not an expression computed at run time.
public struct OSLogPrivacy: Equatable {
    let isPublic: Bool
    @_semantics("constant_evaluable") init(isPublic: Bool) { self.isPublic = isPublic }
    /// Shown in the log.
    @_semantics("constant_evaluable") public static var `public`: OSLogPrivacy { OSLogPrivacy(isPublic: true) }
    /// Redacted unless a debugger is attached.
    @_semantics("constant_evaluable") public static var `private`: OSLogPrivacy { OSLogPrivacy(isPublic: false) }
    /// Redacted outside development.
    @_semantics("constant_evaluable") public static var sensitive: OSLogPrivacy { OSLogPrivacy(isPublic: false) }
    /// The system decides (dynamic strings are redacted).
    @_semantics("constant_evaluable") public static var auto: OSLogPrivacy { OSLogPrivacy(isPublic: false) }
}

/// `OSLogMessage`: a message built by string interpolation; interpolated values carry their privacy.
public struct OSLogMessage: ExpressibleByStringInterpolation, ExpressibleByStringLiteral {
    /// The interpolation that builds a message.
    public struct StringInterpolation: StringInterpolationProtocol {
        var shown = ""
        var redacted = ""
        /// Creates an interpolation.
        public init(literalCapacity: Int, interpolationCount: Int) {}
        /// Appends a literal part.
        public mutating func appendLiteral(_ literal: String) {
            shown += literal
            redacted += literal
        }
        /// Appends a string with its privacy (`.auto` by default: redacted in the log).
        @_semantics("oslog.requires_constant_arguments")
        public mutating func appendInterpolation(_ argumentString: @autoclosure @escaping () -> String, privacy: OSLogPrivacy = .auto) {
            let value = argumentString()
            shown += value
            redacted += privacy.isPublic ? value : "<private>"
        }
        /// Appends an integer with its privacy (integers are public by default).
        @_semantics("oslog.requires_constant_arguments")
        public mutating func appendInterpolation(_ number: @autoclosure @escaping () -> Int, privacy: OSLogPrivacy = .public) {
            appendInterpolation(String(number()), privacy: privacy)
        }
    }

    let interpolation: StringInterpolation

    /// Creates a message from an interpolation.
    public init(stringInterpolation: StringInterpolation) { interpolation = stringInterpolation }
    /// Creates a message from a literal.
    public init(stringLiteral value: String) {
        var interpolation = StringInterpolation(literalCapacity: 0, interpolationCount: 0)
        interpolation.appendLiteral(value)
        self.interpolation = interpolation
    }
}

/// One entry written to the simulated unified log: what Console.app shows (private values redacted).
@_spi(AppleShimTesting) public struct SimulatedLogEntry: Sendable, Equatable {
    @_spi(AppleShimTesting) public let subsystem: String
    @_spi(AppleShimTesting) public let category: String
    @_spi(AppleShimTesting) public let level: OSLogType
    @_spi(AppleShimTesting) public let message: String
}

/// The simulated unified log.
@_spi(AppleShimTesting) public final class SimulatedUnifiedLog: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [SimulatedLogEntry] = []
    @_spi(AppleShimTesting) public static let shared = SimulatedUnifiedLog()
    func append(_ entry: SimulatedLogEntry) { lock.withLock { entries.append(entry) } }
    @_spi(AppleShimTesting) public var all: [SimulatedLogEntry] { lock.withLock { entries } }
}

/// `Logger`: writes to the unified log under a subsystem and category.
public struct Logger: @unchecked Sendable {
    let subsystem: String
    let category: String

    /// A logger for `subsystem` (reverse-DNS, e.g. `dev.orchard`) and `category`.
    public init(subsystem: String, category: String) {
        self.subsystem = subsystem
        self.category = category
    }

    /// Writes `message` at `level`.
    public func log(level: OSLogType, _ message: OSLogMessage) {
        SimulatedUnifiedLog.shared.append(SimulatedLogEntry(subsystem: subsystem, category: category, level: level, message: message.interpolation.redacted))
    }

    /// Writes `message` at the default level.
    public func log(_ message: OSLogMessage) { log(level: .default, message) }
    /// Writes a debug message.
    public func debug(_ message: OSLogMessage) { log(level: .debug, message) }
    /// Writes an informative message.
    public func info(_ message: OSLogMessage) { log(level: .info, message) }
    /// Writes a message at the default level.
    public func notice(_ message: OSLogMessage) { log(level: .default, message) }
    /// Writes an error.
    public func error(_ message: OSLogMessage) { log(level: .error, message) }
    /// Writes a fault.
    public func fault(_ message: OSLogMessage) { log(level: .fault, message) }
}
#endif
