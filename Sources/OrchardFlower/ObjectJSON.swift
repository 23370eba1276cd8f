/// JSON as the bodies of Flower's `RecordDict`, `ArrayRecord` and `Array` objects use it.
///
/// Writing matches Python's `json.dumps` with its defaults (`", "` and `": "` separators, non-ASCII escaped as
/// `\uXXXX`), so the bytes are flwr's. Reading is strict RFC 8259 and keeps objects' members in order, as
/// `json.loads` does; numbers keep their text.
indirect enum ObjectJSON {
    case null, bool(Bool), number(String), string(String), array([ObjectJSON]), object([(String, ObjectJSON)])

    /// The integer a number holds when it is written as one (no fraction or exponent) and fits `Int`.
    var int: Int? { if case .number(let text) = self { Int(text) } else { nil } }

    /// The text of a string.
    var string: String? { if case .string(let text) = self { text } else { nil } }

    /// `text` as `json.dumps` writes a string: quoted, `"` and `\` escaped, control characters and everything
    /// outside printable ASCII as `\n`-style or `\uXXXX` escapes (UTF-16, lowercase hex).
    static func quoted(_ text: String) -> String {
        var out = "\""
        for unit in text.utf16 {
            switch unit {
            case 0x22: out += "\\\""
            case 0x5C: out += "\\\\"
            case 0x0A: out += "\\n"
            case 0x0D: out += "\\r"
            case 0x09: out += "\\t"
            case 0x08: out += "\\b"
            case 0x0C: out += "\\f"
            case 0x20...0x7E: out.unicodeScalars.append(Unicode.Scalar(UInt8(unit)))
            default:
                let hex = String(unit, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            }
        }
        return out + "\""
    }

    /// `[1, 2]` as `json.dumps` writes a list of integers.
    static func list(_ values: [Int]) -> String {
        "[" + values.map(String.init).joined(separator: ", ") + "]"
    }

    /// `{"name": value, …}` as `json.dumps` writes an object whose values are already JSON text.
    static func object(_ members: [(String, String)]) -> String {
        "{" + members.map { "\(quoted($0)): \($1)" }.joined(separator: ", ") + "}"
    }

    /// Parses a complete JSON document, or throws `invalid_object` naming what is wrong and where.
    static func parse(_ bytes: ArraySlice<UInt8>) throws(FlowerError) -> ObjectJSON {
        var parser = Parser(bytes: bytes)
        let value = try parser.value()
        parser.skipSpace()
        guard parser.position == bytes.endIndex else { throw parser.failure("text after the JSON value") }
        return value
    }

    private struct Parser {
        let bytes: ArraySlice<UInt8>
        var position: Int
        var depth = 0

        init(bytes: ArraySlice<UInt8>) {
            self.bytes = bytes
            position = bytes.startIndex
        }

        func failure(_ what: String) -> FlowerError {
            FlowerError(.invalidObject, "the JSON body has \(what) at byte \(position - bytes.startIndex)")
        }

        var current: UInt8? { position < bytes.endIndex ? bytes[position] : nil }

        mutating func skipSpace() {
            while let byte = current, byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 { position += 1 }
        }

        mutating func consume(_ byte: UInt8) -> Bool {
            skipSpace()
            guard current == byte else { return false }
            position += 1
            return true
        }

        mutating func value() throws(FlowerError) -> ObjectJSON {
            skipSpace()
            guard depth < 32 else { throw failure("more than 32 levels of nesting") }
            guard let byte = current else { throw failure("no value where one is due") }
            switch byte {
            case UInt8(ascii: "{"):
                let members = try sequence(close: UInt8(ascii: "}")) { parser throws(FlowerError) in
                    parser.skipSpace()
                    guard parser.current == UInt8(ascii: "\"") else { throw parser.failure("a member name that is not a string") }
                    let name = try parser.string()
                    guard parser.consume(UInt8(ascii: ":")) else { throw parser.failure("no ':' after a member name") }
                    return (name, try parser.value())
                }
                return .object(members)
            case UInt8(ascii: "["):
                return .array(try sequence(close: UInt8(ascii: "]")) { parser throws(FlowerError) in try parser.value() })
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
            default:
                for (word, literal) in [("true", ObjectJSON.bool(true)), ("false", .bool(false)), ("null", .null)]
                where bytes[position...].starts(with: word.utf8) {
                    position += word.utf8.count
                    return literal
                }
                throw failure("an unexpected character")
            }
        }

        /// The comma-separated elements of an array or object whose opening bracket is current.
        mutating func sequence<Element>(close: UInt8, _ element: (inout Parser) throws(FlowerError) -> Element) throws(FlowerError) -> [Element] {
            position += 1
            depth += 1
            defer { depth -= 1 }
            var elements: [Element] = []
            if consume(close) { return elements }
            repeat { elements.append(try element(&self)) } while consume(UInt8(ascii: ","))
            guard consume(close) else { throw failure("no ',' or closing bracket after an element") }
            return elements
        }

        mutating func string() throws(FlowerError) -> String {
            position += 1
            var scalars = String.UnicodeScalarView()
            var run = position
            func flush(upTo end: Int) throws(FlowerError) {
                guard let text = String(strictUTF8: bytes[run..<end]) else { throw failure("a string that is not UTF-8") }
                scalars += text.unicodeScalars
            }
            while let byte = current, byte != UInt8(ascii: "\"") {
                guard byte >= 0x20 else { throw failure("a raw control character in a string") }
                guard byte == UInt8(ascii: "\\") else {
                    position += 1
                    continue
                }
                try flush(upTo: position)
                position += 1
                let simple: [UInt8: Unicode.Scalar] = [0x22: "\"", 0x5C: "\\", 0x2F: "/", 0x62: "\u{8}", 0x66: "\u{C}", 0x6E: "\n", 0x72: "\r", 0x74: "\t"]
                if let escape = current, let scalar = simple[escape] {
                    position += 1
                    scalars.append(scalar)
                } else {
                    scalars.append(try escapedScalar())
                }
                run = position
            }
            guard current != nil else { throw failure("an unterminated string") }
            try flush(upTo: position)
            position += 1
            return String(scalars)
        }

        /// The scalar of a `uXXXX` escape (after its backslash), joining a surrogate pair written as two escapes.
        mutating func escapedScalar() throws(FlowerError) -> Unicode.Scalar {
            func unit() -> UInt32? {
                guard current == UInt8(ascii: "u"), position + 5 <= bytes.endIndex,
                    bytes[(position + 1)..<(position + 5)].allSatisfy({ Character(Unicode.Scalar($0)).isHexDigit }),
                    let value = UInt32(String(decoding: bytes[(position + 1)..<(position + 5)], as: UTF8.self), radix: 16)
                else { return nil }
                position += 5
                return value
            }
            guard let first = unit() else { throw failure("an invalid escape in a string") }
            var value = first
            if (0xD800...0xDBFF).contains(first) {
                guard current == UInt8(ascii: "\\") else { throw failure("an unpaired surrogate in a string") }
                position += 1
                guard let second = unit(), (0xDC00...0xDFFF).contains(second) else { throw failure("an unpaired surrogate in a string") }
                value = 0x10000 + (first - 0xD800) << 10 + (second - 0xDC00)
            }
            guard let scalar = Unicode.Scalar(value) else { throw failure("an unpaired surrogate in a string") }
            return scalar
        }

        mutating func number() throws(FlowerError) -> ObjectJSON {
            let start = position
            func digits() -> Int {
                let first = position
                while let byte = current, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) { position += 1 }
                return position - first
            }
            if current == UInt8(ascii: "-") { position += 1 }
            let integerStart = position
            let integerDigits = digits()
            guard integerDigits > 0, integerDigits == 1 || bytes[integerStart] != UInt8(ascii: "0") else { throw failure("a malformed number") }
            if current == UInt8(ascii: ".") {
                position += 1
                guard digits() > 0 else { throw failure("a malformed number") }
            }
            if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
                position += 1
                if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { position += 1 }
                guard digits() > 0 else { throw failure("a malformed number") }
            }
            return .number(String(decoding: bytes[start..<position], as: UTF8.self))
        }
    }
}
