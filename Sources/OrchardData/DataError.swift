public import OrchardSupport

/// An error reading, transforming or partitioning data.
public struct DataError: OrchardError, Hashable {
    /// A machine-readable category of a data error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case malformedValue, fieldCount, missingHeader, unknownColumn, emptyData, unknownCategory
            case invalidIdx, sizeMismatch, unreadable, invalidArgument, tooFewSamples
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// A field could not be read as the value its column holds.
        public static let malformedValue = Code(.malformedValue)
        /// A row has more or fewer fields than the header (or the first row).
        public static let fieldCount = Code(.fieldCount)
        /// A header is required but the file is empty or the header is malformed.
        public static let missingHeader = Code(.missingHeader)
        /// A column name is not in the table.
        public static let unknownColumn = Code(.unknownColumn)
        /// There are no rows, or no samples, where some are needed.
        public static let emptyData = Code(.emptyData)
        /// A categorical value was not seen when the encoder was fitted.
        public static let unknownCategory = Code(.unknownCategory)
        /// An IDX file's magic number, element type or dimensions are invalid.
        public static let invalidIDX = Code(.invalidIdx)
        /// Sizes that must agree do not (e.g. image and label counts, bytes present and announced).
        public static let sizeMismatch = Code(.sizeMismatch)
        /// A file could not be read or decompressed.
        public static let unreadable = Code(.unreadable)
        /// A parameter is out of its valid range.
        public static let invalidArgument = Code(.invalidArgument)
        /// There are too few samples for the operation (e.g. a standard deviation of one value).
        public static let tooFewSamples = Code(.tooFewSamples)
        /// The code in snake case, e.g. `shape_mismatch`.
        public var description: String { kind.snakeCased }
    }

    /// What went wrong, as a category.
    public var code: Code
    /// A human-readable explanation naming the offending item.
    public var message: String
    /// The 1-based line of the offending value, for text inputs.
    public var line: Int?
    /// The 1-based column (field) of the offending value, for text inputs.
    public var column: Int?

    /// Creates an error.
    /// - Parameters:
    ///   - code: The category.
    ///   - message: What went wrong, naming the offending item.
    ///   - line: The 1-based line, when the error is in a text file.
    ///   - column: The 1-based column, when the error is in one field.
    public init(_ code: Code, _ message: String, line: Int? = nil, column: Int? = nil) {
        self.code = code
        self.message = message
        self.line = line
        self.column = column
    }

    public var description: String {
        var location = ""
        if let line { location += "line \(line)" }
        if let column { location += location.isEmpty ? "column \(column)" : ", column \(column)" }
        return location.isEmpty ? "\(code): \(message)" : "\(code) at \(location): \(message)"
    }
}
