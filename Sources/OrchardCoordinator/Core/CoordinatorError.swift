public import OrchardProtocol
public import OrchardSupport

/// An error the coordinator reports to a caller: a wire code and a message naming the problem.
///
/// The domain knows nothing of HTTP: the HTTP edge maps each code to its status (``httpStatus``).
public struct CoordinatorError: OrchardError, Hashable {
    /// The machine-readable code sent in `ErrorBody`.
    public var code: WireErrorCode
    /// A human-readable explanation.
    public var message: String
    /// Seconds the caller should wait before asking again, for a refusal that passes (`WireErrorCode.rateLimited`).
    public var retryAfter: Double?

    /// Creates an error.
    public init(_ code: WireErrorCode, _ message: String, retryAfter: Double? = nil) {
        self.code = code
        self.message = message
        self.retryAfter = retryAfter
    }

    /// A rate-limit refusal: ask again after `seconds` (whole seconds, at least 1, as `Retry-After` carries them).
    static func rateLimited(_ message: String, retryAfter seconds: Double) -> CoordinatorError {
        let whole = max(1, seconds.rounded(.up))
        return CoordinatorError(.rateLimited, "\(message); retry after \(Int(whole)) s", retryAfter: whole)
    }

    /// The wire body for this error.
    public var body: ErrorBody { ErrorBody(code: code, message: message) }

    static func unauthorized(_ message: String) -> CoordinatorError { .init(.unauthorized, message) }
    static func internalError(_ message: String) -> CoordinatorError { .init(.internalError, message) }
}
