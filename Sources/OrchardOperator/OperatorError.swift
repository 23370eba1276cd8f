import Foundation
public import OrchardProtocol
public import OrchardSupport

/// Why an operator command failed: the coordinator refused the call (its own error code and message), it could not
/// be reached, or a local input (a file, an option) is wrong. ``description`` is the one line `orchard process`
/// prints after `error: `.
public struct OperatorError: OrchardError, Hashable {
    /// The kind of failure: a code of the coordinator's (`unknown_process`, `invalid_configuration`, …) or one of
    /// the local ones below.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        /// The snake-case code.
        public let rawValue: String
        /// A code from its snake-case text.
        public init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// The coordinator's code for an error it answered with.
        public static func server(_ code: WireErrorCode) -> Code { Code(code.rawValue) }
        /// A file named on the command line does not exist or cannot be read.
        public static let missingFile = Code("missing_file")
        /// The model architecture JSON does not parse or is not a valid model.
        public static let invalidModel = Code("invalid_model")
        /// The weights file is not safetensors, or does not match the model.
        public static let invalidWeights = Code("invalid_weights")
        /// A client or server configuration (file or options) is not valid.
        public static let invalidConfiguration = Code("invalid_configuration")
        /// An argument is not valid (a process id, a checkpoint number, a URL, the admin token's source).
        public static let invalidArgument = Code("invalid_argument")
        /// The admin token was refused (401) or is missing.
        public static let unauthorized = Code("unauthorized")
        /// The coordinator cannot be reached (refused, timed out, unknown host).
        public static let unreachable = Code("unreachable")
        /// The TLS handshake with the coordinator failed (untrusted certificate, wrong host).
        public static let tls = Code("tls")
        /// The coordinator's answer is not what its API documents.
        public static let unexpectedAnswer = Code("unexpected_answer")
        /// A local file could not be written.
        public static let writeFailed = Code("write_failed")
    }

    /// What went wrong, as a code.
    public var code: Code
    /// What went wrong, naming what to fix, on one line.
    public var message: String
    /// The HTTP status of a server error, nil for local failures.
    public var httpStatus: Int?

    /// Creates an error.
    public init(_ code: Code, _ message: String, httpStatus: Int? = nil) {
        self.code = code
        self.message = message
        self.httpStatus = httpStatus
    }

    /// `code: message` on one line (line breaks in a server's message are flattened).
    public var description: String {
        let flat = message.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: " ")
        return "\(code): \(flat)"
    }
}
