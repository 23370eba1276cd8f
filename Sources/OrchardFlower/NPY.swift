/// The element types Orchard reads and writes in Flower arrays and `.npy` files, named as NumPy names them
/// (`str(ndarray.dtype)`, which is what a Flower `Array` records as its `dtype`).
public enum NumPyDType: String, Sendable, Hashable, CaseIterable {
    /// Little-endian floats, signed and unsigned integers, and one-byte booleans.
    case float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64, bool

    /// Bytes per element.
    public var itemSize: Int {
        switch self {
        case .int8, .uint8, .bool: 1
        case .int16, .uint16: 2
        case .float32, .int32, .uint32: 4
        case .float64, .int64, .uint64: 8
        }
    }

    /// The `.npy` type descriptor NumPy writes for this type on a little-endian machine, e.g. `<f4`, `|u1`.
    public var descr: String {
        let kind: Character =
            switch self {
            case .float32, .float64: "f"
            case .int8, .int16, .int32, .int64: "i"
            case .uint8, .uint16, .uint32, .uint64: "u"
            case .bool: "b"
            }
        return "\(itemSize == 1 ? "|" : "<")\(kind)\(itemSize)"
    }

    /// The type of a `.npy` descriptor; one-byte types may say `|`, `<` or `=`, wider ones must be little-endian.
    public init?(descr: String) {
        guard let order = descr.first, let type = Self.allCases.first(where: { $0.descr.dropFirst() == descr.dropFirst() }),
            order == "<" || (type.itemSize == 1 && (order == "|" || order == "="))
        else { return nil }
        self = type
    }
}

/// Reads and writes NumPy's `.npy` format (versions 1.0, 2.0 and 3.0): the magic `\x93NUMPY`, the version, the
/// header length, a Python dict literal `{'descr': …, 'fortran_order': …, 'shape': (…)}` padded to 64 bytes, then
/// the elements in C order. Flower's arrays carry exactly these bytes (`np.save(allow_pickle=False)`).
public enum NPY {
    /// A format version; ``encode(_:version:)`` picks the oldest that can hold the header, as NumPy does.
    public enum Version: Sendable, Hashable, CaseIterable {
        /// 1.0: a 2-byte header length, Latin-1 header.
        case v1
        /// 2.0: a 4-byte header length, Latin-1 header.
        case v2
        /// 3.0: a 4-byte header length, UTF-8 header.
        case v3

        var bytes: (major: UInt8, lengthSize: Int) {
            switch self {
            case .v1: (1, 2)
            case .v2: (2, 4)
            case .v3: (3, 4)
            }
        }
    }

    /// The longest header NumPy reads without `allow_pickle` (its `max_header_size`).
    public static let maximumHeaderLength = 10_000
    private static let magic: [UInt8] = [0x93] + Array("NUMPY".utf8)

    /// The `.npy` file of `array`, byte for byte what `np.save(allow_pickle=False)` writes for it.
    /// - Parameters:
    ///   - array: The array (C order).
    ///   - version: The format version; by default 1.0, or 2.0 when the header needs more than 65,535 bytes.
    public static func encode(_ array: FlowerArray, version: Version? = nil) -> [UInt8] {
        let shape = array.shape.count == 1 ? "(\(array.shape[0]),)" : "(\(array.shape.map(String.init).joined(separator: ", ")))"
        var header = "{'descr': '\(array.dtype.descr)', 'fortran_order': False, 'shape': \(shape), }"
        // NumPy leaves room for the first dimension to grow to 21 digits.
        if let first = array.shape.first { header += String(repeating: " ", count: max(0, 21 - String(first).utf8.count)) }
        let text = Array(header.utf8)
        let chosen = version ?? (wrapLength(text.count, .v1) <= Int(UInt16.max) ? .v1 : .v2)
        let length = wrapLength(text.count, chosen)
        var out = magic + [chosen.bytes.major, 0]
        for index in 0..<chosen.bytes.lengthSize { out.append(UInt8(truncatingIfNeeded: length >> (8 * index))) }
        out += text
        out += [UInt8](repeating: 0x20, count: length - text.count - 1)
        out.append(0x0A)
        out += array.data
        return out
    }

    /// The header length field for a header text of `count` bytes: text, padding and newline, so that the data
    /// starts on a 64-byte boundary (a full 64 bytes of padding when it already would).
    private static func wrapLength(_ count: Int, _ version: Version) -> Int {
        let unpadded = count + 1
        return unpadded + 64 - (magic.count + 2 + version.bytes.lengthSize + unpadded) % 64
    }

    /// Decodes a `.npy` file.
    /// An array in Fortran order (`fortran_order: True`: what NumPy writes for a transposed or `np.asfortranarray`
    /// matrix) is returned in C order, the order ``FlowerArray`` holds.
    /// - Throws: ``FlowerError`` `invalid_npy` (magic, version, header syntax or keys), `unsupported_dtype` (a type
    ///   ``NumPyDType`` does not have), `shape_mismatch` (the data is not exactly the shape's elements).
    public static func decode(_ bytes: [UInt8]) throws(FlowerError) -> FlowerArray {
        guard bytes.count >= 8, Array(bytes[0..<6]) == magic else {
            throw FlowerError(.invalidNpy, "not a .npy file: it does not start with \\x93NUMPY")
        }
        guard bytes[7] == 0, let version = Version.allCases.first(where: { $0.bytes.major == bytes[6] }) else {
            throw FlowerError(.invalidNpy, ".npy version \(bytes[6]).\(bytes[7]) is not 1.0, 2.0 or 3.0")
        }
        let headerStart = 8 + version.bytes.lengthSize
        guard bytes.count >= headerStart else { throw FlowerError(.invalidNpy, "the .npy file ends inside its header length") }
        let length = (0..<version.bytes.lengthSize).reduce(0) { $0 | Int(bytes[8 + $1]) << (8 * $1) }
        guard length <= bytes.count - headerStart else {
            throw FlowerError(.invalidNpy, "the .npy header announces \(length) bytes but only \(bytes.count - headerStart) follow")
        }
        guard length <= maximumHeaderLength else {
            throw FlowerError(.invalidNpy, "the .npy header is \(length) bytes, more than NumPy reads (\(maximumHeaderLength))")
        }
        let headerBytes = bytes[headerStart..<(headerStart + length)]
        let text: String
        if version == .v3 {
            guard let utf8 = String(strictUTF8: headerBytes) else { throw FlowerError(.invalidNpy, "the .npy 3.0 header is not UTF-8") }
            text = utf8
        } else {
            text = String(String.UnicodeScalarView(headerBytes.map { Unicode.Scalar($0) }))
        }
        let (dtype, shape, fortranOrder) = try parseHeader(text)
        let array = try FlowerArray(dtype: dtype, shape: shape, data: Array(bytes[(headerStart + length)...]))
        return fortranOrder ? try cOrder(fromFortran: array) : array
    }

    /// The same elements laid out in C order (the last index fastest) from Fortran order (the first index fastest).
    static func cOrder(fromFortran array: FlowerArray) throws(FlowerError) -> FlowerArray {
        let shape = array.shape
        guard shape.count > 1, array.count > 1 else { return array }
        let size = array.dtype.itemSize
        // Fortran strides, in elements: 1, d0, d0·d1, …
        var fortranStrides = [Int](repeating: 1, count: shape.count)
        for axis in 1..<shape.count { fortranStrides[axis] = fortranStrides[axis - 1] * shape[axis - 1] }
        var out = [UInt8](repeating: 0, count: array.data.count)
        var index = [Int](repeating: 0, count: shape.count)  // the C-order multi-index of element `element`
        array.data.withUnsafeBufferPointer { source in
            out.withUnsafeMutableBufferPointer { target in
                for element in 0..<array.count {
                    var from = 0
                    for axis in 0..<shape.count { from += index[axis] * fortranStrides[axis] }
                    for byte in 0..<size { target[element * size + byte] = source[from * size + byte] }
                    // Next C-order index: the last axis fastest.
                    var axis = shape.count - 1
                    while axis >= 0 {
                        index[axis] += 1
                        if index[axis] < shape[axis] { break }
                        index[axis] = 0
                        axis -= 1
                    }
                }
            }
        }
        return try FlowerArray(dtype: array.dtype, shape: shape, data: out)
    }

    private static func parseHeader(_ text: String) throws(FlowerError) -> (NumPyDType, [Int], fortranOrder: Bool) {
        var parser = PythonLiteralParser(text)
        guard case .dict(let items)? = parser.document() else {
            throw FlowerError(.invalidNpy, "the .npy header is not a Python dict literal: \(text.prefix(120))")
        }
        // A repeated key keeps its last value, as Python's dict does.
        let fields = Dictionary(items, uniquingKeysWith: { _, last in last })
        guard Set(fields.keys) == ["descr", "fortran_order", "shape"] else {
            throw FlowerError(.invalidNpy, "the .npy header has keys \(items.map(\.0)); expected descr, fortran_order and shape")
        }
        guard case .tuple(let dimensions)? = fields["shape"] else {
            throw FlowerError(.invalidNpy, "the .npy shape is not a tuple: \(text.prefix(120))")
        }
        var shape: [Int] = []
        for dimension in dimensions {
            guard case .int(let value?) = dimension, value >= 0 else {
                throw FlowerError(.invalidNpy, "the .npy shape \(dimensions) is not a tuple of non-negative integers")
            }
            shape.append(value)
        }
        guard case .bool(let fortranOrder)? = fields["fortran_order"] else {
            throw FlowerError(.invalidNpy, "the .npy fortran_order is not True or False")
        }
        guard case .string(let descr)? = fields["descr"] else {
            throw FlowerError(.unsupportedDtype, "the .npy descr is not a plain type string (a structured dtype?)")
        }
        guard let dtype = NumPyDType(descr: descr) else {
            throw FlowerError(.unsupportedDtype, "the .npy dtype '\(descr)' is not one of \(NumPyDType.allCases.map(\.descr).joined(separator: " "))")
        }
        return (dtype, shape, fortranOrder)
    }
}

/// The Python literals a `.npy` header may hold: strings, integers, booleans, `None`, tuples, lists and dicts
/// with string keys (whatever else `ast.literal_eval` reads is a syntax error here).
private indirect enum PythonLiteral {
    case string(String), int(Int?), bool(Bool), none, tuple([PythonLiteral]), list([PythonLiteral])
    case dict([(String, PythonLiteral)])
}

/// A recursive-descent reader of one Python literal followed by nothing but white space.
private struct PythonLiteralParser {
    private let scalars: [Unicode.Scalar]
    private var position = 0
    private var depth = 0

    init(_ text: String) { scalars = Array(text.unicodeScalars) }

    /// The literal, or nil when the text is not exactly one.
    mutating func document() -> PythonLiteral? {
        guard let value = value() else { return nil }
        skipSpace()
        return position == scalars.count ? value : nil
    }

    private var current: Unicode.Scalar? { position < scalars.count ? scalars[position] : nil }

    private mutating func skipSpace() {
        while let scalar = current, scalar == " " || scalar == "\t" || scalar == "\n" || scalar == "\r" { position += 1 }
    }

    private mutating func consume(_ scalar: Unicode.Scalar) -> Bool {
        skipSpace()
        guard current == scalar else { return false }
        position += 1
        return true
    }

    private mutating func value() -> PythonLiteral? {
        skipSpace()
        guard let scalar = current, depth < 32 else { return nil }
        switch scalar {
        case "'", "\"": return string().map(PythonLiteral.string)
        case "(", "[":
            let close: Unicode.Scalar = scalar == "(" ? ")" : "]"
            position += 1
            guard let (items, trailingComma) = sequence(until: close) else { return nil }
            // `(3)` is the integer 3, not a tuple.
            if close == ")" && items.count == 1 && !trailingComma { return items[0] }
            return close == ")" ? .tuple(items) : .list(items)
        case "{":
            position += 1
            return dict()
        case "-", "+", "0"..."9": return integer()
        default: return word()
        }
    }

    /// Comma-separated values up to `close`; whether a comma came last.
    private mutating func sequence(until close: Unicode.Scalar) -> ([PythonLiteral], Bool)? {
        depth += 1
        defer { depth -= 1 }
        var items: [PythonLiteral] = []
        var trailingComma = false
        while !consume(close) {
            guard items.isEmpty || trailingComma, let item = value() else { return nil }
            items.append(item)
            trailingComma = consume(",")
        }
        return (items, trailingComma)
    }

    private mutating func dict() -> PythonLiteral? {
        depth += 1
        defer { depth -= 1 }
        var items: [(String, PythonLiteral)] = []
        var separated = true
        while !consume("}") {
            skipSpace()
            guard separated, current == "'" || current == "\"", let key = string(), consume(":"), let item = value() else { return nil }
            items.append((key, item))
            separated = consume(",")
        }
        return .dict(items)
    }

    /// A quoted string; backslash escapes of quotes, backslashes and the usual control characters.
    private mutating func string() -> String? {
        let quote = scalars[position]
        position += 1
        var out = String.UnicodeScalarView()
        while let scalar = current, scalar != quote, scalar != "\n" {
            position += 1
            guard scalar == "\\" else {
                out.append(scalar)
                continue
            }
            guard let escaped = current else { return nil }
            position += 1
            let map: [Unicode.Scalar: Unicode.Scalar] = ["n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", "\"": "\""]
            guard let replacement = map[escaped] else { return nil }
            out.append(replacement)
        }
        guard current == quote else { return nil }
        position += 1
        return String(out)
    }

    /// A decimal integer; `.int(nil)` when it does not fit in `Int`.
    private mutating func integer() -> PythonLiteral? {
        var negative = false
        if current == "-" || current == "+" {
            negative = current == "-"
            position += 1
        }
        var value: Int? = 0
        var digits = 0
        while let scalar = current, ("0"..."9").contains(scalar) {
            let digit = Int(scalar.value - 48)
            value = value.flatMap { v in
                let (shifted, overflow) = v.multipliedReportingOverflow(by: 10)
                let (sum, overflow2) = shifted.addingReportingOverflow(negative ? -digit : digit)
                return overflow || overflow2 ? nil : sum
            }
            digits += 1
            position += 1
        }
        if current == "L" { position += 1 }  // Python 2's long suffix, as NumPy's header filter accepts.
        return digits > 0 ? .int(value) : nil
    }

    private mutating func word() -> PythonLiteral? {
        var name = ""
        while let scalar = current, scalar.properties.isAlphabetic { name.unicodeScalars.append(scalar); position += 1 }
        switch name {
        case "True": return .bool(true)
        case "False": return .bool(false)
        case "None": return PythonLiteral.none
        default: return nil
        }
    }
}
