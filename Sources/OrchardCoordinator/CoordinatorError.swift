public import OrchardProtocol

/// An error the coordinator reports to a caller: a wire code, an HTTP status and a message naming the problem.
public struct CoordinatorError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The machine-readable code sent in ``ErrorBody``.
    public var code: WireErrorCode
    /// The HTTP status the error maps to (4xx for bad input, 500 only for the coordinator's own failures).
    public var status: Int
    /// A human-readable explanation.
    public var message: String

    /// Creates an error.
    public init(_ code: WireErrorCode, status: Int, _ message: String) {
        self.code = code
        self.status = status
        self.message = message
    }

    public var description: String { "\(status) \(code): \(message)" }

    /// The wire body for this error.
    public var body: ErrorBody { ErrorBody(code: code, message: message) }

    static func badRequest(_ code: WireErrorCode, _ message: String) -> CoordinatorError { .init(code, status: 400, message) }
    static func unauthorized(_ message: String) -> CoordinatorError { .init(.unauthorized, status: 401, message) }
    static func forbidden(_ code: WireErrorCode, _ message: String) -> CoordinatorError { .init(code, status: 403, message) }
    static func notFound(_ code: WireErrorCode, _ message: String) -> CoordinatorError { .init(code, status: 404, message) }
    static func conflict(_ code: WireErrorCode, _ message: String) -> CoordinatorError { .init(code, status: 409, message) }
    static func unprocessable(_ code: WireErrorCode, _ message: String) -> CoordinatorError { .init(code, status: 422, message) }
    static func internalError(_ message: String) -> CoordinatorError { .init(.internalError, status: 500, message) }
}
