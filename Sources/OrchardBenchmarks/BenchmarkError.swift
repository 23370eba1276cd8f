/// An error configuring or running a benchmark.
public struct BenchmarkError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A machine-readable category of a benchmark error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, Sendable, Hashable { case invalidConfiguration, unexpectedResponse, connectionClosed }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// A configuration field is out of its valid range; `context["field"]` names it.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// The server under test answered with an unexpected status or body; `context["request"]` names the request.
        public static let unexpectedResponse = Code(.unexpectedResponse)
        /// The server closed a connection while a request was waiting for its answer.
        public static let connectionClosed = Code(.connectionClosed)

        /// The code as a snake-case string, e.g. `invalid_configuration`.
        public var description: String {
            kind.rawValue.reduce(into: "") { out, ch in
                if ch.isUppercase { out += "_" + ch.lowercased() } else { out.append(ch) }
            }
        }
    }

    /// The category.
    public let code: Code
    /// A human-readable explanation.
    public let message: String
    /// Details: `field` for a configuration error, `request` and `status` for a response.
    public let context: [String: String]

    /// Creates an error.
    public init(_ code: Code, _ message: String, context: [String: String] = [:]) {
        self.code = code
        self.message = message
        self.context = context
    }

    /// A configuration error naming `field`.
    static func invalid(_ field: String, _ requirement: String, not value: some CustomStringConvertible) -> BenchmarkError {
        BenchmarkError(.invalidConfiguration, "\(field) must be \(requirement), not \(value)", context: ["field": field])
    }

    /// A response outside the expected status to `request` (e.g. `GET /health`).
    static func status(_ status: Int, to request: String) -> BenchmarkError {
        BenchmarkError(.unexpectedResponse, "\(request): HTTP \(status)", context: ["request": request, "status": "\(status)"])
    }

    /// `code: message`.
    public var description: String { "\(code): \(message)" }
}
