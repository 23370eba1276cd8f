/// A table read from a delimited text file: named columns, each either numeric or text.
///
/// Columns are stored whole (column-major), so selecting features for a model is a lookup, and a row subset
/// (``rows(_:)``) copies only the rows it keeps.
public struct Table: Sendable, Hashable {
    /// The values of one column.
    public enum Column: Sendable, Hashable {
        /// Real values.
        case numeric([Double])
        /// Raw text values (e.g. categories), trimmed of surrounding whitespace.
        case text([String])

        /// Number of values.
        public var count: Int {
            switch self {
            case .numeric(let values): values.count
            case .text(let values): values.count
            }
        }

        func rows(_ indices: [Int]) -> Column {
            switch self {
            case .numeric(let values): .numeric(indices.map { values[$0] })
            case .text(let values): .text(indices.map { values[$0] })
            }
        }
    }

    /// Column names, in file order.
    public let columnNames: [String]
    /// Column values, parallel to ``columnNames``.
    public let columns: [Column]
    /// Number of rows.
    public let rowCount: Int

    /// Creates a table from named columns of equal length.
    /// - Parameters:
    ///   - columnNames: Unique, non-empty names.
    ///   - columns: One column per name, all of the same length.
    public init(columnNames: [String], columns: [Column]) throws(DataError) {
        guard columnNames.count == columns.count else {
            throw DataError(.sizeMismatch, "\(columnNames.count) column names for \(columns.count) columns")
        }
        var seen = Set<String>()
        for name in columnNames where name.isEmpty || !seen.insert(name).inserted {
            throw DataError(.invalidArgument, "column name '\(name)' is empty or repeated")
        }
        let rowCount = columns.first?.count ?? 0
        for (name, column) in zip(columnNames, columns) where column.count != rowCount {
            throw DataError(.sizeMismatch, "column '\(name)' has \(column.count) rows, expected \(rowCount)")
        }
        self.columnNames = columnNames
        self.columns = columns
        self.rowCount = rowCount
    }

    private init(unchecked columnNames: [String], columns: [Column], rowCount: Int) {
        self.columnNames = columnNames
        self.columns = columns
        self.rowCount = rowCount
    }

    /// The position of the column called `name`.
    public func columnIndex(_ name: String) throws(DataError) -> Int {
        guard let index = columnNames.firstIndex(of: name) else {
            throw DataError(.unknownColumn, "no column '\(name)' (columns: \(columnNames.joined(separator: ", ")))")
        }
        return index
    }

    /// The values of a numeric column.
    public func numeric(_ name: String) throws(DataError) -> [Double] {
        switch columns[try columnIndex(name)] {
        case .numeric(let values): return values
        case .text: throw DataError(.invalidArgument, "column '\(name)' holds text, not numbers")
        }
    }

    /// The values of a column as category labels: text as read, numbers in their shortest exact form
    /// (so `1`, `1.0` and `1e0` are the same category).
    public func categories(_ name: String) throws(DataError) -> [String] {
        switch columns[try columnIndex(name)] {
        case .text(let values): return values
        case .numeric(let values): return values.map(Self.categoryLabel)
        }
    }

    /// The canonical category label of a number: integers without a fraction, others in Swift's shortest form.
    public static func categoryLabel(_ value: Double) -> String {
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }

    /// A table holding the given rows, in the given order.
    /// - Parameter indices: Row positions; each must be in `0..<rowCount`.
    public func rows(_ indices: [Int]) -> Table {
        precondition(indices.allSatisfy { (0..<rowCount).contains($0) }, "row index out of range")
        return Table(unchecked: columnNames, columns: columns.map { $0.rows(indices) }, rowCount: indices.count)
    }
}
