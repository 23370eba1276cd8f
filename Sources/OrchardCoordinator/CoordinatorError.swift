public import OrchardProtocol
public import OrchardSupport

/// An error the coordinator reports to a caller: a wire code and a message naming the problem.
///
/// The domain knows nothing of HTTP: the HTTP edge maps each code to its status (``httpStatus``).
public struct CoordinatorError: OrchardError, Hashable {
    /// The machine-readable code sent in ``ErrorBody``.
    public var code: WireErrorCode
    /// A human-readable explanation.
    public var message: String
    /// Seconds after which the same request may succeed (sent as `Retry-After`), for refusals of a busy server.
    public var retryAfterSeconds: Int?

    /// Creates an error.
    public init(_ code: WireErrorCode, _ message: String, retryAfterSeconds: Int? = nil) {
        self.code = code
        self.message = message
        self.retryAfterSeconds = retryAfterSeconds
    }

    /// The wire body for this error.
    public var body: ErrorBody { ErrorBody(code: code, message: message) }

    static func unauthorized(_ message: String) -> CoordinatorError { .init(.unauthorized, message) }
    static func internalError(_ message: String) -> CoordinatorError { .init(.internalError, message) }
}
