public import OrchardSupport
public import OrchardProtocol

/// The one error the device SDK throws: a category, a message naming the problem, and the server's details
/// when the coordinator answered with an error.
public struct OrchardClientError: OrchardError, Hashable {
    /// A machine-readable category of client error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case invalidConfiguration, authenticationFailed, rejected, conditionsNotMet, network, serverError
            case incompatibleModel, cancelled, storage, training, diverged, tls
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// The client was configured wrongly (e.g. an invalid server URL).
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// The coordinator refused the device's credentials.
        public static let authenticationFailed = Code(.authenticationFailed)
        /// The coordinator turned the device away for now; see ``OrchardClientError/retryAfter``.
        public static let rejected = Code(.rejected)
        /// The device's conditions (power, network) do not allow a cycle now.
        public static let conditionsNotMet = Code(.conditionsNotMet)
        /// The coordinator could not be reached, or the connection broke.
        public static let network = Code(.network)
        /// The coordinator answered with an error; see ``OrchardClientError/serverCode``.
        public static let serverError = Code(.serverError)
        /// The model or plan cannot be used by this device (bad architecture, corrupt or mismatched weights).
        public static let incompatibleModel = Code(.incompatibleModel)
        /// The work stopped because its task was cancelled; local progress was saved.
        public static let cancelled = Code(.cancelled)
        /// The client's state directory could not be read or written.
        public static let storage = Code(.storage)
        /// Local training failed (e.g. the dataset does not fit the model).
        public static let training = Code(.training)
        /// Local training produced NaN or infinity (it diverged, e.g. from a global model poisoned out of range); nothing
        /// was sent.
        public static let diverged = Code(.diverged)
        /// The TLS connection failed, e.g. the coordinator's certificate is not trusted (not retried).
        public static let tls = Code(.tls)
        /// The code in snake case, e.g. `shape_mismatch`.
        public var description: String { kind.snakeCased }
    }

    /// What went wrong, as a category.
    public var code: Code
    /// A human-readable explanation.
    public var message: String
    /// The HTTP status of the coordinator's answer, when there was one.
    public var httpStatus: Int?
    /// The coordinator's error code, when it answered with an `ErrorBody`.
    public var serverCode: WireErrorCode?
    /// Seconds to wait before asking again: for ``Code/rejected``, and for a coordinator's 429 or 503 answer
    /// that carried `Retry-After`.
    public var retryAfter: Double?

    /// Creates an error.
    public init(_ code: Code, _ message: String, httpStatus: Int? = nil, serverCode: WireErrorCode? = nil, retryAfter: Double? = nil) {
        self.code = code
        self.message = message
        self.httpStatus = httpStatus
        self.serverCode = serverCode
        self.retryAfter = retryAfter
    }

    public var description: String {
        var text = "\(code): \(message)"
        if let httpStatus, let serverCode { text += " (HTTP \(httpStatus) \(serverCode))" }
        return text
    }

    /// Maps a coordinator error answer to a client error: 401 is an authentication failure, everything else
    /// a server error carrying the server's code and message.
    /// - Parameters:
    ///   - status: The HTTP status.
    ///   - body: The decoded error body, if the answer had one.
    ///   - retryAfter: Seconds the answer asked the client to wait (its `Retry-After`), if any.
    public static func server(status: Int, body: ErrorBody?, retryAfter: Double? = nil) -> OrchardClientError {
        let code: WireErrorCode = body?.error.code ?? (status >= 500 ? .internalError : WireErrorCode("http_\(status)"))
        let message = body?.error.message ?? "the coordinator answered HTTP \(status)"
        if status == 401 || code == .unauthorized {
            return OrchardClientError(.authenticationFailed, message, httpStatus: status, serverCode: code, retryAfter: retryAfter.map(RetryAfter.bounded))
        }
        return OrchardClientError(.serverError, message, httpStatus: status, serverCode: code, retryAfter: retryAfter.map(RetryAfter.bounded))
    }

    /// Whether the answer was the coordinator's own refusal (an Orchard error body), not a status from something in
    /// between (a proxy's 404 or 408, a load balancer's maintenance page).
    public var isCoordinatorRefusal: Bool { serverCode.map { !$0.rawValue.hasPrefix("http_") } ?? false }

    /// Whether repeating the same request may succeed: network failures, 5xx answers and 429 (too many requests).
    public var isTransient: Bool {
        code == .network || (code == .serverError && ((httpStatus ?? 0) >= 500 || httpStatus == 429))
    }
}
