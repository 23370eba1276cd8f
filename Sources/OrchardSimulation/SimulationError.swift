public import OrchardSupport

/// An error configuring or running a fleet simulation.
public struct SimulationError: OrchardError, Hashable {
    /// A machine-readable category of a simulation error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case invalidOption, invalidTrace, unreadable, unwritable, incompatible, coordinator, training
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// An option is out of its valid range or cannot be parsed.
        public static let invalidOption = Code(.invalidOption)
        /// An availability trace file is malformed.
        public static let invalidTrace = Code(.invalidTrace)
        /// An input file could not be read.
        public static let unreadable = Code(.unreadable)
        /// An output file could not be written.
        public static let unwritable = Code(.unwritable)
        /// Options that are valid alone do not fit together (e.g. a model and a dataset).
        public static let incompatible = Code(.incompatible)
        /// The coordinator refused or failed an operation the simulation relies on.
        public static let coordinator = Code(.coordinator)
        /// Training on a device failed.
        public static let training = Code(.training)
        /// The code in snake case, e.g. `shape_mismatch`.
        public var description: String { kind.snakeCased }
    }

    /// The category.
    public let code: Code
    /// A human-readable explanation.
    public let message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
}
