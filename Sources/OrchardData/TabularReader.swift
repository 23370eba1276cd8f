public import Foundation
import OrchardSupport

/// Reads comma-, whitespace- or character-separated text into a ``Table``.
///
/// Every column is numeric unless named in ``Configuration/textColumns``; a field that is not a finite number
/// in a numeric column is an error that names its line and column (both 1-based), never a silent `NaN`.
/// Blank lines and lines starting with the comment prefix are skipped. With the comma (or any character)
/// separator, fields may be double-quoted, with `""` for a literal quote; fields are trimmed of spaces.
public struct TabularReader: Sendable {
    /// How fields are separated.
    public struct Separator: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: Sendable, Hashable { case character(Character), whitespace }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// Fields separated by commas (CSV).
        public static let comma = Separator(.character(","))
        /// Fields separated by runs of spaces or tabs (as in the original `housing.data`).
        public static let whitespace = Separator(.whitespace)
        /// Fields separated by one given character (e.g. `;` or a tab).
        public static func character(_ character: Character) -> Separator { Separator(.character(character)) }

        var character: Character? {
            if case .character(let c) = kind { return c }
            return nil
        }

        public var description: String {
            switch kind {
            case .whitespace: "whitespace"
            case .character(let c): "'\(c)'"
            }
        }
    }

    /// Where column names come from.
    public struct Header: Sendable, Hashable {
        private enum Kind: Sendable, Hashable { case firstLine, absent([String]?) }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// The first non-blank, non-comment line names the columns.
        public static let firstLine = Header(.firstLine)
        /// There is no header; columns are named by `names`, or `column1`, `column2`, … when `names` is nil.
        public static func absent(names: [String]? = nil) -> Header { Header(.absent(names)) }

        var isFirstLine: Bool { kind == .firstLine }
        var givenNames: [String]? {
            if case .absent(let names) = kind { return names }
            return nil
        }
    }

    /// How to read a file.
    public struct Configuration: Sendable, Hashable {
        /// The field separator.
        public var separator: Separator
        /// Where column names come from.
        public var header: Header
        /// Columns kept as text (e.g. categorical labels); all others must be numbers.
        public var textColumns: Set<String>
        /// Lines starting with this prefix are skipped; nil disables comments.
        public var commentPrefix: String?

        /// Creates a configuration; the defaults read a CSV file with a header line and numeric columns.
        public init(separator: Separator = .comma, header: Header = .firstLine, textColumns: Set<String> = [], commentPrefix: String? = "#") {
            self.separator = separator
            self.header = header
            self.textColumns = textColumns
            self.commentPrefix = commentPrefix
        }
    }

    /// How this reader reads.
    public var configuration: Configuration

    /// Creates a reader.
    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
    }

    /// Reads a file.
    public func read(contentsOf url: URL) throws(DataError) -> Table {
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw DataError(.unreadable, "cannot read \(url.path): \(FileAccessError(error).message)")
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw DataError(.unreadable, "\(url.path) is not UTF-8 text")
        }
        return try read(text: text)
    }

    /// Reads text already in memory.
    public func read(text: String) throws(DataError) -> Table {
        var names: [String]? = configuration.header.givenNames
        var kinds: [Bool] = []  // true: text column
        var numeric: [[Double]] = []
        var texts: [[String]] = []
        var lineNumber = 0

        // Swift reads "\r\n" as one Character, so lines end at any newline Character (LF, CRLF or CR).
        for line in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline) {
            lineNumber += 1
            if line.allSatisfy(\.isWhitespace) { continue }
            if let prefix = configuration.commentPrefix, line.drop(while: \.isWhitespace).hasPrefix(prefix) { continue }
            let fields = try split(line, lineNumber: lineNumber)

            if names == nil && configuration.header.isFirstLine {
                guard fields.allSatisfy({ !$0.isEmpty }) else {
                    throw DataError(.missingHeader, "the header has an empty column name", line: lineNumber)
                }
                names = fields
                continue
            }
            if names == nil { names = (1...fields.count).map { "column\($0)" } }
            let columnNames = names!
            if kinds.isEmpty {
                for name in configuration.textColumns where !columnNames.contains(name) {
                    throw DataError(.unknownColumn, "text column '\(name)' is not among \(columnNames.joined(separator: ", "))")
                }
                kinds = columnNames.map { configuration.textColumns.contains($0) }
                numeric = Array(repeating: [], count: columnNames.count)
                texts = Array(repeating: [], count: columnNames.count)
            }
            guard fields.count == columnNames.count else {
                throw DataError(.fieldCount, "found \(fields.count) fields, expected \(columnNames.count)", line: lineNumber)
            }
            for (column, field) in fields.enumerated() {
                if kinds[column] {
                    texts[column].append(field)
                } else if let value = Double(field), value.isFinite {
                    numeric[column].append(value)
                } else {
                    let shown = field.isEmpty ? "an empty field" : "'\(field)'"
                    throw DataError(
                        .malformedValue, "\(shown) in numeric column '\(columnNames[column])' is not a finite number",
                        line: lineNumber, column: column + 1)
                }
            }
        }
        guard let columnNames = names else {
            throw DataError(configuration.header.isFirstLine ? .missingHeader : .emptyData, "the input has no lines")
        }
        if kinds.isEmpty { kinds = columnNames.map { configuration.textColumns.contains($0) } }
        let columns: [Table.Column] = columnNames.indices.map { i in
            kinds[i] ? .text(texts.isEmpty ? [] : texts[i]) : .numeric(numeric.isEmpty ? [] : numeric[i])
        }
        return try Table(columnNames: columnNames, columns: columns)
    }

    private func split(_ line: Substring, lineNumber: Int) throws(DataError) -> [String] {
        guard let separator = configuration.separator.character else {
            return line.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        }
        var fields: [String] = []
        var current = ""
        var quoted = false
        var wasQuoted = false
        var iterator = line.makeIterator()
        while let ch = iterator.next() {
            if quoted {
                if ch == "\"" {
                    // A doubled quote inside a quoted field is a literal quote.
                    var lookahead = iterator
                    if lookahead.next() == "\"" {
                        current.append("\"")
                        iterator = lookahead
                    } else {
                        quoted = false
                    }
                } else {
                    current.append(ch)
                }
            } else if ch == separator {
                fields.append(wasQuoted ? current : current.trimmingCharacters(in: .whitespaces))
                current = ""
                wasQuoted = false
            } else if ch == "\"" && current.allSatisfy({ $0 == " " || $0 == "\t" }) && !wasQuoted {
                quoted = true
                wasQuoted = true
                current = ""
            } else if wasQuoted {
                if ch != " " && ch != "\t" {
                    throw DataError(.malformedValue, "text after a closing quote", line: lineNumber, column: fields.count + 1)
                }
            } else {
                current.append(ch)
            }
        }
        if quoted {
            throw DataError(.malformedValue, "unterminated quoted field", line: lineNumber, column: fields.count + 1)
        }
        fields.append(wasQuoted ? current : current.trimmingCharacters(in: .whitespaces))
        return fields
    }
}
