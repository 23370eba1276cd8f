public import OrchardSupport

/// An error raised by the training engine: bad shapes, bad configuration, unavailable resources.
public struct EngineError: OrchardError, Hashable {
    /// A machine-readable category of an engine error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case shapeMismatch, invalidArgument, invalidModel, unavailable, incompatibleCheckpoint, cancelled
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// Tensor shapes do not fit the operation.
        public static let shapeMismatch = Code(.shapeMismatch)
        /// An argument is out of its allowed range.
        public static let invalidArgument = Code(.invalidArgument)
        /// A model definition cannot be built.
        public static let invalidModel = Code(.invalidModel)
        /// A requested resource (such as the system BLAS) is not available.
        public static let unavailable = Code(.unavailable)
        /// A checkpoint does not match the model it is loaded into.
        public static let incompatibleCheckpoint = Code(.incompatibleCheckpoint)
        /// Work stopped because its task was cancelled.
        public static let cancelled = Code(.cancelled)
        /// The code in snake case, e.g. `shape_mismatch`.
        public var description: String { kind.snakeCased }
    }

    /// What went wrong, as a category.
    public var code: Code
    /// A human-readable explanation naming the offending item.
    public var message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

}
