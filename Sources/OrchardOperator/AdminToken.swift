import Foundation

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
    /// - Throws: ``OperatorError`` (`unauthorized`) when neither or both are given, the file cannot be read, or the
    ///   token is empty or malformed.
    public static func resolve(file: String?, environment: String?) throws(OperatorError) -> String {
        switch (file, environment) {
        case (.some, .some):
            throw OperatorError(.unauthorized, "the admin token is given 2 ways (--admin-token-file, \(environmentVariable)); give it one way")
        case (nil, nil):
            throw OperatorError(.unauthorized, "no admin token: set \(environmentVariable) or give --admin-token-file FILE")
        case (let file?, nil):
            return try checked(try read(file), source: "--admin-token-file '\(file)'")
        case (nil, let environment?):
            return try checked(environment, source: environmentVariable)
        }
    }

    private static func read(_ path: String) throws(OperatorError) -> String {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw OperatorError(.missingFile, "--admin-token-file '\(path)' does not exist")
        }
        guard !isDirectory.boolValue else { throw OperatorError(.missingFile, "--admin-token-file '\(path)' is a directory, not a file") }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw OperatorError(.missingFile, "--admin-token-file '\(path)' cannot be read (permission denied)")
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw OperatorError(.unauthorized, "--admin-token-file '\(path)' is not UTF-8 text")
        }
        return text
    }

    private static func checked(_ text: String, source: String) throws(OperatorError) -> String {
        let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !token.isEmpty else { throw OperatorError(.unauthorized, "\(source) holds an empty admin token") }
        guard token.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value != 0x7F }) else {
            throw OperatorError(.unauthorized, "\(source) holds an admin token with spaces or control characters inside; no Authorization header can carry it")
        }
        return token
    }
}
