public import OrchardSupport

/// An error reading or validating one of Orchard's file formats.
public struct FormatError: OrchardError, Hashable {
    /// A machine-readable category of a format error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case truncated, invalidHeader, unsupportedDType, shapeMismatch, missingTensor, unexpectedTensor
            case invalidOffsets, invalidSpec, dtypeMismatch
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// The data ended before the structure it announced.
        public static let truncated = Code(.truncated)
        /// A header could not be parsed.
        public static let invalidHeader = Code(.invalidHeader)
        /// A tensor's element type is not one Orchard reads.
        public static let unsupportedDType = Code(.unsupportedDType)
        /// A tensor's element type is not the one expected.
        public static let dtypeMismatch = Code(.dtypeMismatch)
        /// A tensor's shape is not the one expected.
        public static let shapeMismatch = Code(.shapeMismatch)
        /// An expected tensor is absent.
        public static let missingTensor = Code(.missingTensor)
        /// A tensor that was not expected is present.
        public static let unexpectedTensor = Code(.unexpectedTensor)
        /// Tensor byte ranges overlap, leave holes, or run past the buffer.
        public static let invalidOffsets = Code(.invalidOffsets)
        /// A model architecture is not valid.
        public static let invalidSpec = Code(.invalidSpec)
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
