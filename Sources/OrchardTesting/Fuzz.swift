import Foundation
public import OrchardProtocol

/// Random inputs for decoders: arbitrary JSON values, and mutations of valid JSON and safetensors bodies. Every
/// function draws only from the generator it is given, so a seeded generator reproduces its inputs (the
/// property-based tests pass the one their `propertyCheck` seeds).
public enum Fuzz {
    /// Numbers that sit on or just past the limits decoders and validators check.
    public static let edgeNumbers: [Double] = [
        0, -0.0, 1, -1, 0.5, -0.5, 2, 3, 255, 256, 65_536, 65_537, 16_777_216, 16_777_217, 2_147_483_648, 2_147_483_649,
        1e9, 1e15, 9_007_199_254_740_992, 1e18, 9.3e18, 1e19, -1e19, 1e300, -1e300, Double.leastNonzeroMagnitude, 1e-300, 31_536_001,
    ]

    /// Strings that are empty, long, made of control or non-ASCII characters, or look like other types.
    public static let edgeStrings: [String] = [
        "", " ", "a", "tiny", "1", "1.0", "1.0.0", "2.0", "1.0.0.0.0", "-1", "1e3", "null", "true", "{}", "[]",
        "a\u{0}b", "\u{1}", "\u{7F}", "é", "名前", "😀", "w_0123456789abcdef01234567", "p_0123456789abcdef",
        "0123456789abcdef0123456789abcdef", String(repeating: "x", count: 201), String(repeating: "é", count: 300),
        "../../etc/passwd", "a.b", "open", "hs256", "rs256", "clip", "reject", "fedavg", "sgd", "adam", "mse",
        "dense", "conv2d", "same", "valid",
    ]

    /// An arbitrary JSON value at most `depth` levels deep.
    public static func value(depth: Int = 3, using random: inout some RandomNumberGenerator) -> JSONValue {
        let kind = Int.random(in: depth > 0 ? 0...7 : 0...4, using: &random)
        switch kind {
        case 0: return .null
        case 1: return .bool(Bool.random(using: &random))
        case 2: return .number(number(using: &random))
        case 3, 4: return .string(string(using: &random))
        case 5: return .array((0..<Int.random(in: 0...4, using: &random)).map { _ in value(depth: depth - 1, using: &random) })
        default:
            var members: [String: JSONValue] = [:]
            for _ in 0..<Int.random(in: 0...5, using: &random) {
                members[string(using: &random)] = value(depth: depth - 1, using: &random)
            }
            return .object(members)
        }
    }

    /// An edge number, a small integer or an arbitrary finite double.
    public static func number(using random: inout some RandomNumberGenerator) -> Double {
        switch Int.random(in: 0...2, using: &random) {
        case 0: return edgeNumbers.randomElement(using: &random)!
        case 1: return Double(Int.random(in: -10...100, using: &random))
        default:
            let bits = UInt64.random(in: 0...UInt64.max, using: &random)
            let value = Double(bitPattern: bits)
            return value.isFinite ? value : Double(Int64(bitPattern: bits))
        }
    }

    /// An edge string or a short random one (any Unicode scalar but surrogates).
    public static func string(using random: inout some RandomNumberGenerator) -> String {
        if Bool.random(using: &random) { return edgeStrings.randomElement(using: &random)! }
        var scalars = String.UnicodeScalarView()
        for _ in 0..<Int.random(in: 0...12, using: &random) {
            let range: ClosedRange<UInt32> = Bool.random(using: &random) ? 0x20...0x7E : 0...0x10FFFF
            if let scalar = Unicode.Scalar(UInt32.random(in: range, using: &random)) { scalars.append(scalar) }
        }
        return String(scalars)
    }

    /// `value` with one random edit somewhere inside: a member removed, added or replaced (by an arbitrary value, an
    /// edge number or string, or a value of another type), an array element removed, duplicated or replaced.
    public static func mutate(_ value: JSONValue, using random: inout some RandomNumberGenerator) -> JSONValue {
        switch value {
        case .object(var members) where !members.isEmpty && Int.random(in: 0...3, using: &random) > 0:
            let key = members.keys.sorted().randomElement(using: &random)!
            switch Int.random(in: 0...4, using: &random) {
            case 0: members[key] = nil
            case 1: members[string(using: &random)] = self.value(using: &random)
            case 2: members[key] = replacement(for: members[key]!, using: &random)
            default: members[key] = mutate(members[key]!, using: &random)
            }
            return .object(members)
        case .array(var items) where !items.isEmpty && Int.random(in: 0...3, using: &random) > 0:
            let index = Int.random(in: items.indices, using: &random)
            switch Int.random(in: 0...3, using: &random) {
            case 0: items.remove(at: index)
            case 1: items.insert(items[index], at: index)
            case 2: items[index] = replacement(for: items[index], using: &random)
            default: items[index] = mutate(items[index], using: &random)
            }
            return .array(items)
        default:
            return replacement(for: value, using: &random)
        }
    }

    private static func replacement(for value: JSONValue, using random: inout some RandomNumberGenerator) -> JSONValue {
        switch (value, Int.random(in: 0...3, using: &random)) {
        case (.number, 0), (.number, 1): return .number(edgeNumbers.randomElement(using: &random)!)
        case (.string, 0), (.string, 1): return .string(edgeStrings.randomElement(using: &random)!)
        default: return self.value(depth: 2, using: &random)
        }
    }

    /// Applies 1…`maximum` edits of ``mutate(_:using:)``.
    public static func mutate(_ value: JSONValue, edits maximum: Int, using random: inout some RandomNumberGenerator) -> JSONValue {
        var current = value
        for _ in 0..<Int.random(in: 1...max(1, maximum), using: &random) { current = mutate(current, using: &random) }
        return current
    }

    /// The JSON text of a value (sorted keys).
    public static func json(_ value: JSONValue) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        guard let data = try? encoder.encode(value) else { return Array("null".utf8) }
        return [UInt8](data)
    }

    /// Random bytes, at most `maximum` of them.
    public static func bytes(maximum: Int = 2048, using random: inout some RandomNumberGenerator) -> [UInt8] {
        (0..<Int.random(in: 0...maximum, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
    }
}

/// Mutations of a valid safetensors file: raw byte damage, and edits of its header (parsed, edited, written back
/// with a consistent length) that keep it parseable so the checks behind the parser are reached.
public enum SafetensorsMutation: String, CaseIterable, Sendable {
    /// One byte anywhere replaced.
    case flipByte
    /// The file cut short.
    case truncate
    /// Bytes appended.
    case appendGarbage
    /// The 8-byte header length replaced by a smaller, larger or huge value.
    case headerLengthLie
    /// A tensor's shape edited (a dimension changed, added or removed, made negative or huge).
    case shapeEdit
    /// A tensor's dtype replaced (another known dtype, an unknown one, a non-string).
    case dtypeEdit
    /// A tensor's `data_offsets` edited (shifted, swapped, negative, past the end, not two numbers).
    case offsetEdit
    /// A tensor renamed, removed or duplicated under another name.
    case tensorEdit
    /// The `__metadata__` edited: a member added, removed or replaced, its report JSON mutated.
    case metadataEdit
    /// A float of the data replaced by arbitrary bits (NaN, infinity, huge values).
    case randomFloat

    /// Applies this mutation to `valid`, a well-formed safetensors file; `metadataKey` names a metadata member
    /// holding JSON (e.g. a report's) whose content `metadataEdit` mutates.
    public func apply(to valid: [UInt8], metadataKey: String? = nil, using random: inout some RandomNumberGenerator) -> [UInt8] {
        var body = valid
        // `valid` may be the output of an earlier mutation: its announced length is clamped to what is there.
        let announced = valid.count >= 8 ? valid[0..<8].enumerated().reduce(UInt64(0)) { $0 | UInt64($1.element) << (8 * UInt64($1.offset)) } : 0
        let headerLength = Int(min(announced, UInt64(max(0, valid.count - 8))))
        let dataStart = min(valid.count, 8 + headerLength)
        switch self {
        case .flipByte:
            guard !body.isEmpty else { return body }
            body[Int.random(in: body.indices, using: &random)] ^= UInt8.random(in: 1...255, using: &random)
            return body
        case .truncate:
            guard !body.isEmpty else { return body }
            body.removeLast(Int.random(in: 1...body.count, using: &random))
            return body
        case .appendGarbage:
            return body + (0..<Int.random(in: 1...64, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
        case .headerLengthLie:
            let lengths: [UInt64] = [
                0, 1, 7, UInt64(max(0, headerLength - 1)), UInt64(headerLength + 1), UInt64(valid.count), 100_000_001, UInt64(Int.max), UInt64.max,
                UInt64.random(in: 0...UInt64.max, using: &random),
            ]
            let length = lengths.randomElement(using: &random)!
            withUnsafeBytes(of: length.littleEndian) { for i in 0..<8 where i < body.count { body[i] = $0[i] } }
            return body
        case .randomFloat:
            let floats = (valid.count - dataStart) / 4
            guard floats > 0 else { return body }
            let index = dataStart + 4 * Int.random(in: 0..<floats, using: &random)
            let specials: [UInt32] = [0x7FC0_0000, 0x7F80_0000, 0xFF80_0000, 0x7F7F_FFFF, 0xFF7F_FFFF, UInt32.random(in: 0...UInt32.max, using: &random)]
            withUnsafeBytes(of: specials.randomElement(using: &random)!.littleEndian) { for i in 0..<4 { body[index + i] = $0[i] } }
            return body
        case .shapeEdit, .dtypeEdit, .offsetEdit, .tensorEdit, .metadataEdit:
            guard valid.count >= 8, 8 + headerLength <= valid.count,
                case .object(var header)? = try? JSONValue.parse(valid[8..<(8 + headerLength)])
            else { return body }
            let names = header.keys.filter { $0 != "__metadata__" }.sorted()
            let name = names.randomElement(using: &random)
            switch self {
            case .shapeEdit:
                guard let name, case .object(var tensor)? = header[name] else { break }
                var shape: [JSONValue] = []
                if case .array(let dimensions)? = tensor["shape"] { shape = dimensions }
                switch Int.random(in: 0...6, using: &random) {
                case 0 where !shape.isEmpty:
                    shape[Int.random(in: shape.indices, using: &random)] = .number(Fuzz.edgeNumbers.randomElement(using: &random)!)
                    tensor["shape"] = .array(shape)
                case 1:
                    tensor["shape"] = .array(shape + [.number(Double(Int.random(in: 0...3, using: &random)))])
                case 2 where !shape.isEmpty:
                    tensor["shape"] = .array(Array(shape.dropLast()))
                case 3 where !shape.isEmpty:
                    shape[0] = .number(-1)
                    tensor["shape"] = .array(shape)
                case 4 where shape.count > 1, 5 where shape.count > 1:
                    // Another shape of the same element count (the bytes still fit; only the shape is wrong).
                    let count = shape.reduce(1.0) { $0 * ($1.numberValue ?? 1) }
                    tensor["shape"] = Bool.random(using: &random) ? .array([.number(count)]) : .array(Array(shape.reversed()) + [.number(1)])
                default:
                    tensor["shape"] = Fuzz.value(depth: 1, using: &random)
                }
                header[name] = .object(tensor)
            case .dtypeEdit:
                guard let name, case .object(var tensor)? = header[name] else { break }
                let dtypes: [JSONValue] = ["F64", "F16", "I32", "I64", "BF16", "U8", "f32", ""].map { .string($0) } + [.number(4), .null]
                tensor["dtype"] = dtypes.randomElement(using: &random)!
                header[name] = .object(tensor)
            case .offsetEdit:
                guard let name, case .object(var tensor)? = header[name], case .array(let offsets)? = tensor["data_offsets"], offsets.count == 2,
                    let start = offsets[0].numberValue, let end = offsets[1].numberValue
                else { break }
                let pairs: [[Double]] = [
                    [end, start], [start + 4, end + 4], [start - 4, end], [-1, end], [start, 1e19], [start, Double(valid.count)],
                    [start], [start, end, end], [0.5, end],
                ]
                let edits: [JSONValue] = pairs.map { .array($0.map { .number($0) }) } + [.array([.string("0"), .string("4")]), .null]
                tensor["data_offsets"] = edits.randomElement(using: &random)!
                header[name] = .object(tensor)
            case .tensorEdit:
                guard let name else { break }
                switch Int.random(in: 0...2, using: &random) {
                case 0: header[name] = nil
                case 1: header[name + ".x"] = header[name]; header[name] = nil
                default: header[Fuzz.string(using: &random)] = header[name]
                }
            default:
                var metadata = header["__metadata__"]?.objectValue ?? [:]
                if let metadataKey, let text = metadata[metadataKey]?.stringValue, let json = try? JSONValue.parse(Array(text.utf8)),
                    Bool.random(using: &random)
                {
                    metadata[metadataKey] = .string(String(decoding: Fuzz.json(Fuzz.mutate(json, edits: 2, using: &random)), as: UTF8.self))
                    header["__metadata__"] = .object(metadata)
                } else {
                    switch Int.random(in: 0...3, using: &random) {
                    case 0:
                        header["__metadata__"] = Fuzz.value(depth: 2, using: &random)
                    case 1:
                        metadata[Fuzz.string(using: &random)] = Fuzz.value(depth: 1, using: &random)
                        header["__metadata__"] = .object(metadata)
                    case 2:
                        if let key = metadata.keys.sorted().randomElement(using: &random) { metadata[key] = nil }
                        header["__metadata__"] = .object(metadata)
                    default:
                        if let key = metadata.keys.sorted().randomElement(using: &random) { metadata[key] = .string(Fuzz.string(using: &random)) }
                        header["__metadata__"] = .object(metadata)
                    }
                }
            }
            var text = Fuzz.json(.object(header))
            while text.count % 8 != 0 { text.append(0x20) }
            var out: [UInt8] = []
            withUnsafeBytes(of: UInt64(text.count).littleEndian) { out.append(contentsOf: $0) }
            return out + text + valid[dataStart...]
        }
    }
}
