public import OrchardSupport

/// Why an HTTP exchange with a coordinator or a SuperLink failed before an answer could be read, or why a
/// connection could not be set up. Each client (device transport, Flower node, admin client) turns it into its own
/// error with its own advice.
public struct ConnectionError: OrchardError, Hashable {
    /// A machine-readable category of a connection failure.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case invalidConfiguration, cancelled, tls, network, answerTooLarge
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// A URL, timeout or trust-root setting that cannot work.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// The calling task was cancelled.
        public static let cancelled = Code(.cancelled)
        /// The TLS handshake failed (an untrusted certificate, a wrong host name): retrying does not help.
        public static let tls = Code(.tls)
        /// The peer could not be reached or stopped answering: refused, reset, timed out, unknown host.
        public static let network = Code(.network)
        /// The answer was larger than the caller's limit.
        public static let answerTooLarge = Code(.answerTooLarge)
        /// The code in snake case, e.g. `answer_too_large`.
        public var description: String { kind.snakeCased }
    }

    /// What went wrong, as a category.
    public var code: Code
    /// The reason in a few words, without the URL (`connection refused`, `the server's certificate is not trusted`).
    public var message: String

    /// Creates an error with a code and a message.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
}
