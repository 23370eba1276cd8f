import Foundation
public import OrchardSupport

/// Where an operator command takes the coordinator's admin token from: the `ORCHARD_ADMIN_TOKEN` environment
/// variable or `--admin-token-file FILE` — one of them, never both, and never a plain option (a token on the command
/// line can be read by every local user). The same rules as `orchard serve`'s: surrounding whitespace is ignored;
/// an empty token or one holding spaces or control characters is refused; the token itself is never shown.
public enum AdminToken {
    /// The environment variable holding the token.
    public static let environmentVariable = "ORCHARD_ADMIN_TOKEN"

    /// The token.
    /// - Parameters:
    ///   - file: `--admin-token-file`, if given.
    ///   - environment: The value of ``environmentVariable``, if set.
    ///   - warn: Told what `orchard serve` would log about the source: a token file other users can read.
    /// - Throws: ``OperatorError`` (`unauthorized`) when neither or both are given, the file cannot be read, or the
    ///   token is empty or malformed.
    public static func resolve(file: String?, environment: String?, warn: (String) -> Void = { _ in }) throws(OperatorError) -> String {
        let resolved: (token: String?, warnings: [String])
        do {
            resolved = try AdminTokenSource.resolve(file: file, environment: environment, argument: nil)
        } catch {
            throw OperatorError(error.code == .unreadableFile ? .missingFile : .unauthorized, error.message)
        }
        guard let token = resolved.token else {
            throw OperatorError(.unauthorized, "no admin token: set \(environmentVariable) or give --admin-token-file FILE")
        }
        for warning in resolved.warnings { warn(warning) }
        return token
    }
}

/// Why `orchard serve` cannot take its admin token.
public struct AdminTokenError: OrchardError, Hashable {
    /// The kind of failure.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind { case conflictingSources, unreadableFile, emptyToken, malformedToken }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        /// The token was given more than one way.
        public static let conflictingSources = Code(.conflictingSources)
        /// The token file cannot be read.
        public static let unreadableFile = Code(.unreadableFile)
        /// The token is empty (or only whitespace).
        public static let emptyToken = Code(.emptyToken)
        /// The token holds whitespace or control characters, so no `Authorization` header can carry it.
        public static let malformedToken = Code(.malformedToken)
        public var description: String { kind.snakeCased }
    }

    /// The kind.
    public var code: Code
    /// What went wrong, naming the source (never the token).
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
}

/// Where `orchard serve` (and, without the deprecated argument, every operator command) takes the admin token from:
/// `--admin-token-file`, `ORCHARD_ADMIN_TOKEN`, or (deprecated) `--admin-token`.
public enum AdminTokenSource {
    /// The environment variable holding the token.
    public static let environmentVariable = "ORCHARD_ADMIN_TOKEN"

    /// The token (nil when none was given) and the warnings to log about how it was given.
    public static func resolve(file: String?, environment: String?, argument: String?) throws(AdminTokenError) -> (token: String?, warnings: [String]) {
        try SecretSource(what: "admin token", fileOption: "--admin-token-file", environmentVariable: environmentVariable, argumentOption: "--admin-token")
            .resolve(file: file, environment: environment, argument: argument)
    }
}

/// Where `orchard client` and `orchard agent` take the device's JWT from: `--token-file`, `ORCHARD_DEVICE_TOKEN`, or
/// (deprecated: visible to every local user in `ps` for as long as the agent runs) `--token`.
public enum DeviceTokenSource {
    /// The environment variable holding the token.
    public static let environmentVariable = "ORCHARD_DEVICE_TOKEN"

    /// The token (nil when none was given: open mode) and the warnings to print about how it was given.
    public static func resolve(file: String?, environment: String?, argument: String?) throws(AdminTokenError) -> (token: String?, warnings: [String]) {
        try SecretSource(what: "device token", fileOption: "--token-file", environmentVariable: environmentVariable, argumentOption: "--token")
            .resolve(file: file, environment: environment, argument: argument)
    }
}

/// A secret given one way out of three: a file (warned about when other users can read it), an environment
/// variable, or a deprecated command-line option; surrounding whitespace is ignored, and an empty secret or one
/// holding spaces or control characters is refused. The secret itself is never shown.
struct SecretSource {
    var what: String
    var fileOption: String
    var environmentVariable: String
    var argumentOption: String

    func resolve(file: String?, environment: String?, argument: String?) throws(AdminTokenError) -> (token: String?, warnings: [String]) {
        let given = [file.map { _ in fileOption }, environment.map { _ in environmentVariable }, argument.map { _ in argumentOption }].compactMap { $0 }
        guard given.count <= 1 else {
            throw AdminTokenError(.conflictingSources, "the \(what) is given \(given.count) ways (\(given.joined(separator: ", "))); give it one way")
        }
        if let file {
            let text = try read(file)
            let warnings = Self.isPrivate(file) ? [] : ["\(fileOption) '\(file)' can be read by other users; restrict it (chmod 600)"]
            return (try checked(text, source: "\(fileOption) '\(file)'"), warnings)
        }
        if let environment {
            return (try checked(environment, source: environmentVariable), [])
        }
        if let argument {
            let warning =
                "\(argumentOption) is deprecated and will be removed: \(withArticle) on the command line can be read by every local user (ps, /proc); use \(fileOption) or \(environmentVariable)"
            return (try checked(argument, source: argumentOption), [warning])
        }
        return (nil, [])
    }

    /// "an admin token", "a device token".
    private var withArticle: String { ("aeiou".contains(what.first ?? "x") ? "an " : "a ") + what }

    private func read(_ path: String) throws(AdminTokenError) -> String {
        let data: Data
        do throws(FileAccessError) { data = try LocalFile.read(path) } catch {
            throw AdminTokenError(.unreadableFile, "\(fileOption) '\(path)': \(error.message)")
        }
        guard let text = String(data: data, encoding: .utf8) else { throw AdminTokenError(.unreadableFile, "\(fileOption) '\(path)': not UTF-8 text") }
        return text
    }

    private func checked(_ text: String, source: String) throws(AdminTokenError) -> String {
        let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !token.isEmpty else { throw AdminTokenError(.emptyToken, "\(source) holds an empty \(what)") }
        guard token.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value != 0x7F }) else {
            throw AdminTokenError(
                .malformedToken, "\(source) holds \(withArticle) with spaces or control characters inside; no Authorization header can carry it")
        }
        return token
    }

    private static func isPrivate(_ path: String) -> Bool {
        guard let permissions = (try? FileManager.default.attributesOfItem(atPath: path))?[.posixPermissions] as? NSNumber else { return true }
        return permissions.intValue & 0o077 == 0
    }
}
