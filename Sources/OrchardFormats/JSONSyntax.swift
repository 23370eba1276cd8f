/// Where a JSON text stops being JSON (RFC 8259), as a 1-based line and column and what was expected there.
///
/// Foundation's parsers say only "Invalid value around character 35." (and nothing at all about where a file
/// ended too soon), so readers that show a person their mistake scan the text again with ``find(in:)`` once
/// Foundation has refused it: `line 3, column 11: expected a value, found 'small'`.
public struct JSONSyntaxError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The line, from 1.
    public var line: Int
    /// The column, from 1, in Unicode characters (not bytes).
    public var column: Int
    /// What was expected and what was found: `expected ',' or '}', found '"'`.
    public var reason: String

    /// `line L, column C: reason`.
    public var description: String { "line \(line), column \(column): \(reason)" }

    /// The first syntax error of `text`, or nil when it is one JSON value (any kind at the top level) with only
    /// white space around it. A leading UTF-8 byte-order mark is skipped.
    public static func find(in text: some Collection<UInt8>) -> JSONSyntaxError? {
        var scanner = JSONSyntaxScanner(bytes: Array(text))
        do throws(JSONSyntaxScanner.Failure) {
            try scanner.document()
            return nil
        } catch {
            let (line, column) = scanner.lineAndColumn(of: error.offset)
            return JSONSyntaxError(line: line, column: column, reason: error.reason)
        }
    }
}

/// A recursive-descent check of JSON syntax that builds nothing.
private struct JSONSyntaxScanner {
    struct Failure: Error {
        var offset: Int
        var reason: String
    }

    /// Deeper nesting is refused rather than risking the stack (Foundation refuses past 512 too).
    static let maximumDepth = 512

    let bytes: [UInt8]
    /// Where the text starts: after a byte-order mark, if any.
    let start: Int
    var i: Int

    init(bytes: [UInt8]) {
        self.bytes = bytes
        start = bytes.starts(with: [0xEF, 0xBB, 0xBF]) ? 3 : 0
        i = start
    }

    mutating func document() throws(Failure) {
        try value(depth: 0)
        skipWhitespace()
        if i < bytes.count { throw failure("expected the end of the text after the JSON value") }
    }

    mutating func value(depth: Int) throws(Failure) {
        skipWhitespace()
        guard depth < Self.maximumDepth else { throw failure("nesting deeper than \(Self.maximumDepth) levels") }
        guard i < bytes.count else { throw failure("expected a value") }
        switch bytes[i] {
        case UInt8(ascii: "{"): try object(depth: depth)
        case UInt8(ascii: "["): try array(depth: depth)
        case UInt8(ascii: "\""): try string()
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): try number()
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        default:
            let letter = (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(bytes[i] | 0x20)
            let hint = letter || bytes[i] == UInt8(ascii: "'") ? " (strings take double quotes)" : ""
            throw failure("expected a value" + hint)
        }
    }

    mutating func object(depth: Int) throws(Failure) {
        try list(closing: "}") { scanner throws(Failure) in
            guard scanner.at("\"") else {
                throw scanner.failure(scanner.at("}") ? "expected a key in double quotes (no ',' before '}')" : "expected a key in double quotes")
            }
            try scanner.string()
            scanner.skipWhitespace()
            try scanner.expect(":", "expected ':' after the key")
            try scanner.value(depth: depth + 1)
        }
    }

    mutating func array(depth: Int) throws(Failure) {
        try list(closing: "]") { scanner throws(Failure) in
            if scanner.at("]") { throw scanner.failure("expected a value (no ',' before ']')") }
            try scanner.value(depth: depth + 1)
        }
    }

    /// An object or an array from its opening bracket: `member` reads one member or element at a time.
    mutating func list(closing: Unicode.Scalar, member: (inout Self) throws(Failure) -> Void) throws(Failure) {
        i += 1
        skipWhitespace()
        if at(closing) { i += 1; return }
        while true {
            skipWhitespace()
            try member(&self)
            skipWhitespace()
            if try endOfList(closing: closing) { return }
        }
    }

    /// Whether `scalar` stands at the current offset.
    func at(_ scalar: Unicode.Scalar) -> Bool { i < bytes.count && bytes[i] == UInt8(ascii: scalar) }

    /// After a member or element: true at the closing bracket (consumed), false after a comma (consumed).
    mutating func endOfList(closing: Unicode.Scalar) throws(Failure) -> Bool {
        if at(closing) { i += 1; return true }
        try expect(",", "expected ',' or '\(closing)'")
        return false
    }

    mutating func string() throws(Failure) {
        let opening = i
        i += 1
        while i < bytes.count {
            let byte = bytes[i]
            switch byte {
            case UInt8(ascii: "\""):
                i += 1
                return
            case UInt8(ascii: "\\"):
                i += 1
                guard i < bytes.count else { break }
                switch bytes[i] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                    UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    i += 1
                case UInt8(ascii: "u"):
                    i += 1
                    for _ in 0..<4 {
                        guard i < bytes.count, isHexDigit(bytes[i]) else { throw failure("expected four hex digits after '\\u'") }
                        i += 1
                    }
                default:
                    i -= 1
                    throw failure("invalid escape in a string")
                }
            case 0..<0x20:
                if byte == 0x0A || byte == 0x0D { throw Failure(offset: i, reason: "the string has no closing '\"' on its line") }
                throw failure("a control character in a string must be escaped")
            default:
                i += 1
            }
        }
        throw Failure(offset: opening, reason: "the string has no closing '\"'")
    }

    mutating func number() throws(Failure) {
        if bytes[i] == UInt8(ascii: "-") { i += 1 }
        guard i < bytes.count, isDigit(bytes[i]) else { throw failure("expected a digit") }
        if bytes[i] == UInt8(ascii: "0") { i += 1 } else { skipDigits() }
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            i += 1
            guard i < bytes.count, isDigit(bytes[i]) else { throw failure("expected a digit after '.'") }
            skipDigits()
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            guard i < bytes.count, isDigit(bytes[i]) else { throw failure("expected a digit in the exponent") }
            skipDigits()
        }
    }

    mutating func literal(_ word: String) throws(Failure) {
        let utf8 = Array(word.utf8)
        guard bytes[i...].starts(with: utf8), i + utf8.count == bytes.count || !isWordByte(bytes[i + utf8.count]) else {
            throw failure("expected a value (strings take double quotes)")
        }
        i += utf8.count
    }

    mutating func expect(_ scalar: Unicode.Scalar, _ reason: String) throws(Failure) {
        guard at(scalar) else { throw failure(reason) }
        i += 1
    }

    mutating func skipWhitespace() {
        while i < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[i]) { i += 1 }
    }

    mutating func skipDigits() {
        while i < bytes.count, isDigit(bytes[i]) { i += 1 }
    }

    /// A failure at the current offset, naming what stands there.
    func failure(_ expected: String) -> Failure {
        Failure(offset: i, reason: "\(expected), found \(found())")
    }

    /// What stands at the current offset: a word (`'small'`), one character (`'"'`), or the end of the text.
    func found() -> String {
        guard i < bytes.count else { return "the end of the text" }
        switch bytes[i] {
        case 0x0A, 0x0D: return "a line break"
        case 0x09: return "a tab"
        case 0..<0x20: return "the control character U+\(String(bytes[i], radix: 16, uppercase: true).leftPadded(to: 4))"
        default: break
        }
        var end = i
        while end < bytes.count, end - i < 24, isWordByte(bytes[end]) { end += 1 }
        if end == i {
            // One character, however many UTF-8 bytes it takes.
            end = i + 1
            while end < bytes.count, bytes[end] & 0xC0 == 0x80 { end += 1 }
        }
        let text = String(decoding: bytes[i..<end], as: UTF8.self)
        return text == "'" ? "\"'\"" : "'\(text)'"
    }

    /// The 1-based line and column (in characters) of a byte offset.
    func lineAndColumn(of offset: Int) -> (line: Int, column: Int) {
        var line = 1
        var column = 1
        for byte in bytes[start..<max(start, min(offset, bytes.count))] {
            if byte == 0x0A {
                line += 1
                column = 1
            } else if byte & 0xC0 != 0x80 {
                column += 1
            }
        }
        return (line, column)
    }

    func isDigit(_ byte: UInt8) -> Bool { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) }

    func isHexDigit(_ byte: UInt8) -> Bool {
        isDigit(byte) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(byte | 0x20)
    }

    /// Letters, digits, `_`, `.`, `+`, `-` and non-ASCII: the bytes of a bare word or a malformed number.
    func isWordByte(_ byte: UInt8) -> Bool {
        isDigit(byte) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte | 0x20) || byte >= 0x80
            || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "-")
    }
}

private extension String {
    func leftPadded(to width: Int) -> String { String(repeating: "0", count: max(0, width - count)) + self }
}
