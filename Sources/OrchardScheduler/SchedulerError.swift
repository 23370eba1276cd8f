public import OrchardSupport

/// An error from the background task scheduler, its store, or its adapters.
public struct SchedulerError: OrchardError, Hashable {
    /// A machine-readable category of a scheduler error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case notPermitted, alreadyRegistered, registrationClosed, tooManyPendingRequests, invalidRequest
            case windowInProgress, unsupported, storeFailure, unavailable
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// The identifier is not in the scheduler's permitted list (iOS: `BGTaskSchedulerPermittedIdentifiers`).
        public static let notPermitted = Code(.notPermitted)
        /// A handler is already registered for the identifier.
        public static let alreadyRegistered = Code(.alreadyRegistered)
        /// Registration happened after the scheduler started (iOS: after the app finished launching).
        public static let registrationClosed = Code(.registrationClosed)
        /// Accepting the request would exceed the pending-request limit for its kind.
        public static let tooManyPendingRequests = Code(.tooManyPendingRequests)
        /// The request's fields are inconsistent (a negative duration, constraints on an app refresh, …).
        public static let invalidRequest = Code(.invalidRequest)
        /// A window is already running on this scheduler.
        public static let windowInProgress = Code(.windowInProgress)
        /// The platform cannot express what was asked (an Apple adapter limitation).
        public static let unsupported = Code(.unsupported)
        /// The persistent store could not be read or written.
        public static let storeFailure = Code(.storeFailure)
        /// The platform scheduler is unavailable (iOS: background refresh disabled, or a simulator).
        public static let unavailable = Code(.unavailable)
        /// The code in snake case, e.g. `shape_mismatch`.
        public var description: String { kind.snakeCased }
    }

    /// What went wrong, as a category.
    public var code: Code
    /// A human-readable explanation naming the offending item.
    public var message: String

    /// Creates an error with a code and a message.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

}
