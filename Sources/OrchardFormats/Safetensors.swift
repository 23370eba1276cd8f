import Foundation

/// The element types a safetensors file can declare.
public enum DType: String, Sendable, Hashable, Codable, CaseIterable {
    case float32 = "F32"
    case float64 = "F64"
    case float16 = "F16"
    case int64 = "I64"
    case int32 = "I32"
    /// Unsigned 32-bit words (a secure-aggregation masked input; never a model's weights).
    case uint32 = "U32"

    /// Bytes per element.
    public var byteCount: Int {
        switch self {
        case .float64, .int64: 8
        case .float32, .int32, .uint32: 4
        case .float16: 2
        }
    }
}

/// A named, shaped block of Float32 values, as stored in a safetensors file.
public struct TensorRecord: Sendable, Hashable {
    /// The tensor's name, e.g. `dense1.weight`.
    public var name: String
    /// The tensor's shape; the empty shape is a scalar.
    public var shape: [Int]
    /// The values in row-major order; `values.count` equals the product of `shape`.
    public var values: [Float]

    /// Creates a record, checking that the value count matches the shape.
    public init(name: String, shape: [Int], values: [Float]) {
        precondition(shape.allSatisfy { $0 >= 0 }, "negative dimension in shape \(shape)")
        precondition(shape.reduce(1, *) == values.count, "\(name): \(values.count) values do not fill shape \(shape)")
        self.name = name
        self.shape = shape
        self.values = values
    }
}

/// Reads and writes the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
/// header length, a JSON header, then the tensors' bytes.
///
/// Orchard writes Float32 tensors sorted by name with a sorted JSON header, so the same tensors always give the
/// same bytes. Reading accepts F32, and widens or narrows F64 and F16 on request only through `decode`'s
/// `allowConversion`; every structural defect is a ``FormatError``.
public enum Safetensors {
    /// The largest header Orchard accepts (the reference implementation's limit is 100 MB).
    public static let maximumHeaderSize = 100_000_000

    /// Encodes tensors and optional string metadata into safetensors bytes.
    /// - Parameters:
    ///   - tensors: The tensors to write; names must be unique.
    ///   - metadata: Free-form string pairs stored under `__metadata__`.
    public static func encode(_ tensors: [TensorRecord], metadata: [String: String] = [:]) -> [UInt8] {
        let sorted = tensors.sorted { $0.name < $1.name }
        var out = encodeHeader(sorted, metadata: metadata)
        out.reserveCapacity(out.count + sorted.reduce(0) { $0 + $1.values.count * 4 })
        for tensor in sorted {
            #if _endian(little)
            tensor.values.withUnsafeBytes { out.append(contentsOf: $0) }
            #else
            for value in tensor.values {
                withUnsafeBytes(of: value.bitPattern.littleEndian) { out.append(contentsOf: $0) }
            }
            #endif
        }
        return out
    }

    /// The first part of ``encode(_:metadata:)``'s output: the 8-byte header length and the padded JSON header.
    /// The file is this followed by each tensor's values as little-endian Float32, tensors in name order — so a
    /// writer can send a header and tensor data it already holds without assembling one buffer.
    /// - Parameters:
    ///   - tensors: The tensors (only names and shapes are read).
    ///   - metadata: The `__metadata__` string pairs.
    public static func encodeHeader(_ tensors: [TensorRecord], metadata: [String: String] = [:]) -> [UInt8] {
        encodeHeader(layout: tensors.map { (name: $0.name, dtype: DType.float32, shape: $0.shape) }, metadata: metadata)
    }

    /// The header for tensors of any dtype, given their names, dtypes and shapes; the file is this followed by each
    /// tensor's little-endian bytes, tensors in name order.
    public static func encodeHeader(layout: [(name: String, dtype: DType, shape: [Int])], metadata: [String: String] = [:]) -> [UInt8] {
        let sorted = layout.sorted { $0.name < $1.name }
        precondition(Set(sorted.map(\.name)).count == sorted.count, "duplicate tensor names")
        var header = "{"
        var first = true
        func appendKey(_ key: String) {
            if !first { header += "," }
            first = false
            header += jsonString(key) + ":"
        }
        if !metadata.isEmpty {
            appendKey("__metadata__")
            header +=
                "{"
                + metadata.sorted { $0.key < $1.key }
                .map { jsonString($0.key) + ":" + jsonString($0.value) }
                .joined(separator: ",") + "}"
        }
        var offset = 0
        for tensor in sorted {
            let size = tensor.shape.reduce(1, *) * tensor.dtype.byteCount
            appendKey(tensor.name)
            header += "{\"dtype\":\"\(tensor.dtype.rawValue)\",\"shape\":[" + tensor.shape.map(String.init).joined(separator: ",")
            header += "],\"data_offsets\":[\(offset),\(offset + size)]}"
            offset += size
        }
        header += "}"
        var headerBytes = Array(header.utf8)
        while headerBytes.count % 8 != 0 { headerBytes.append(0x20) }
        var out = [UInt8]()
        out.reserveCapacity(8 + headerBytes.count)
        withUnsafeBytes(of: UInt64(headerBytes.count).littleEndian) { out.append(contentsOf: $0) }
        out.append(contentsOf: headerBytes)
        return out
    }

    /// Decodes safetensors bytes into Float32 tensors, in the order of their byte offsets.
    /// - Parameters:
    ///   - bytes: The file's contents.
    ///   - allowConversion: Whether F64 and F16 tensors are converted to Float32 (otherwise they are an error).
    public static func decode(_ bytes: some Collection<UInt8>, allowConversion: Bool = false) throws(FormatError) -> SafetensorsArchive {
        let data = Array(bytes)
        let index = try self.index(data)
        var tensors: [TensorRecord] = []
        tensors.reserveCapacity(index.entries.count)
        for entry in index.entries {
            let count = entry.count
            let base = entry.byteRange.lowerBound
            var values = [Float](repeating: 0, count: count)
            switch entry.dtype {
            case .float32:
                data.withUnsafeBytes { raw in
                    values.withUnsafeMutableBytes { dst in
                        dst.copyMemory(from: UnsafeRawBufferPointer(rebasing: raw[entry.byteRange]))
                    }
                }
                #if _endian(big)
                for i in 0..<count { values[i] = Float(bitPattern: UInt32(littleEndian: values[i].bitPattern)) }
                #endif
            case .float64 where allowConversion:
                data.withUnsafeBytes { raw in
                    for i in 0..<count {
                        let bits = raw.loadUnaligned(fromByteOffset: base + i * 8, as: UInt64.self)
                        values[i] = Float(Double(bitPattern: UInt64(littleEndian: bits)))
                    }
                }
            case .float16 where allowConversion:
                data.withUnsafeBytes { raw in
                    for i in 0..<count {
                        let bits = raw.loadUnaligned(fromByteOffset: base + i * 2, as: UInt16.self)
                        values[i] = halfToFloat(UInt16(littleEndian: bits))
                    }
                }
            default:
                throw FormatError(.dtypeMismatch, "tensor '\(entry.name)' is \(entry.dtype.rawValue); Orchard expects F32")
            }
            tensors.append(TensorRecord(name: entry.name, shape: entry.shape, values: values))
        }
        return SafetensorsArchive(tensors: tensors, metadata: index.metadata)
    }

    /// Reads and checks a safetensors header without copying any tensor data: names, dtypes, shapes and where
    /// each tensor's bytes lie in `data` (contiguous, in offset order, exactly covering the buffer).
    /// - Parameter data: The file's contents.
    public static func index(_ data: [UInt8]) throws(FormatError) -> SafetensorsIndex {
        guard data.count >= 8 else {
            throw FormatError(.truncated, "safetensors data is \(data.count) bytes; the 8-byte header length is missing")
        }
        let headerLength = try self.headerLength(data[0..<8])
        guard 8 + headerLength <= data.count else {
            throw FormatError(.truncated, "safetensors header announces \(headerLength) bytes but only \(data.count - 8) follow")
        }
        let header = try self.header(data[8..<(8 + headerLength)])
        let bufferSize = data.count - header.dataStart
        if let last = header.index.entries.last, last.byteRange.upperBound - header.dataStart > bufferSize {
            throw FormatError(
                .truncated, "tensor '\(last.name)' ends at byte \(last.byteRange.upperBound - header.dataStart) but the buffer holds \(bufferSize)")
        }
        guard header.dataSize == bufferSize else {
            throw FormatError(.invalidOffsets, "safetensors buffer holds \(bufferSize) bytes but tensors cover \(header.dataSize)")
        }
        return header.index
    }

    /// The header length announced by a file's first 8 bytes (little-endian), checked against
    /// ``maximumHeaderSize``.
    /// - Parameter prefix: Exactly the first 8 bytes.
    public static func headerLength(_ prefix: some Collection<UInt8>) throws(FormatError) -> Int {
        let headerLength = try announcedHeaderLength(prefix)
        guard headerLength <= UInt64(maximumHeaderSize) else {
            // A safetensors file starts with its header's length, and its header with `{`: a file starting with
            // text is something else (a JSON model file given as the weights, say).
            if let first = prefix.first, first == UInt8(ascii: "{") || first == UInt8(ascii: "[") {
                throw FormatError(
                    .invalidHeader,
                    "not safetensors: the file starts with '\(Character(UnicodeScalar(first)))', as JSON does (safetensors starts with an 8-byte header length)"
                )
            }
            if prefix.allSatisfy({ (0x20...0x7e).contains($0) || $0 == 0x09 || $0 == 0x0a || $0 == 0x0d }) {
                throw FormatError(.invalidHeader, "not safetensors: the file starts with text (safetensors starts with an 8-byte header length)")
            }
            throw FormatError(.invalidHeader, "safetensors header length \(headerLength) exceeds \(maximumHeaderSize) bytes")
        }
        return Int(headerLength)
    }

    /// The header length a file's first 8 bytes announce (little-endian), unchecked.
    /// - Parameter prefix: Exactly the first 8 bytes.
    public static func announcedHeaderLength(_ prefix: some Collection<UInt8>) throws(FormatError) -> UInt64 {
        guard prefix.count == 8 else {
            throw FormatError(.truncated, "safetensors data is \(prefix.count) bytes; the 8-byte header length is missing")
        }
        var headerLength: UInt64 = 0
        for (i, byte) in prefix.enumerated() { headerLength |= UInt64(byte) << (8 * UInt64(i)) }
        return headerLength
    }

    /// A header read before its tensor data has arrived (streaming): the index (byte ranges as indices into the
    /// whole file), where the data starts and how many data bytes the tensors cover.
    public struct Header: Sendable, Hashable {
        /// The tensors and metadata; each entry's byte range counts from the start of the file.
        public var index: SafetensorsIndex
        /// The file offset of the first data byte (8 + the header length).
        public var dataStart: Int
        /// Data bytes the tensors cover, contiguously from offset 0 of the data section.
        public var dataSize: Int
    }

    /// Reads and checks a header's JSON (the bytes after the 8-byte length): names, dtypes, shapes and offsets,
    /// contiguous from 0 with no gap or overlap. The data section's size is not known here; callers check it.
    /// - Parameter json: The header bytes.
    public static func header(_ json: ArraySlice<UInt8>) throws(FormatError) -> Header {
        let object: [String: Any]
        do {
            guard let parsed = try JSONSerialization.jsonObject(with: Data(json)) as? [String: Any] else {
                throw FormatError(.invalidHeader, "safetensors header is not a JSON object")
            }
            object = parsed
        } catch let error as FormatError {
            throw error
        } catch {
            throw FormatError(.invalidHeader, "safetensors header is not valid JSON")
        }
        let bufferStart = 8 + json.count
        var metadata: [String: String] = [:]
        var entries: [(name: String, dtype: DType, shape: [Int], start: Int, end: Int)] = []
        for (key, value) in object {
            if key == "__metadata__" {
                guard let dict = value as? [String: Any] else {
                    throw FormatError(.invalidHeader, "__metadata__ must be an object of strings")
                }
                for (k, v) in dict {
                    guard let s = v as? String else {
                        throw FormatError(.invalidHeader, "__metadata__[\(k)] is not a string")
                    }
                    metadata[k] = s
                }
                continue
            }
            guard let info = value as? [String: Any],
                let dtypeName = info["dtype"] as? String,
                let shapeAny = info["shape"] as? [Any],
                let offsetsAny = info["data_offsets"] as? [Any], offsetsAny.count == 2
            else {
                throw FormatError(.invalidHeader, "tensor '\(key)' needs dtype, shape and data_offsets")
            }
            guard let dtype = DType(rawValue: dtypeName) else {
                throw FormatError(.unsupportedDType, "tensor '\(key)' has dtype \(dtypeName); Orchard reads F32, F64, F16, I32, I64, U32")
            }
            let shape = try shapeAny.map { (any: Any) throws(FormatError) -> Int in
                guard let n = any as? NSNumber, let i = Int(exactly: n.doubleValue), i >= 0 else {
                    throw FormatError(.invalidHeader, "tensor '\(key)' has a shape entry that is not a non-negative integer")
                }
                return i
            }
            let offsets = try offsetsAny.map { (any: Any) throws(FormatError) -> Int in
                guard let n = any as? NSNumber, let i = Int(exactly: n.doubleValue), i >= 0, i <= Int(Int32.max) * 1024 else {
                    throw FormatError(.invalidOffsets, "tensor '\(key)' has an offset that is not a non-negative integer")
                }
                return i
            }
            entries.append((key, dtype, shape, offsets[0], offsets[1]))
        }
        entries.sort { ($0.start, $0.end, $0.name) < ($1.start, $1.end, $1.name) }
        var cursor = 0
        var located: [SafetensorsIndex.Entry] = []
        located.reserveCapacity(entries.count)
        for entry in entries {
            guard entry.start == cursor, entry.end >= entry.start else {
                throw FormatError(
                    .invalidOffsets,
                    "tensor '\(entry.name)' occupies bytes \(entry.start)..<\(entry.end); expected to start at \(cursor) with no gap or overlap")
            }
            let (count, overflow) = entry.shape.reduce((1, false)) { acc, d in
                let (p, o) = acc.0.multipliedReportingOverflow(by: d)
                return (p, acc.1 || o)
            }
            guard !overflow, count.multipliedReportingOverflow(by: entry.dtype.byteCount).overflow == false,
                entry.end - entry.start == count * entry.dtype.byteCount
            else {
                throw FormatError(
                    .invalidOffsets,
                    "tensor '\(entry.name)' of shape \(entry.shape) and dtype \(entry.dtype.rawValue) does not match its \(entry.end - entry.start) bytes")
            }
            cursor = entry.end
            located.append(
                SafetensorsIndex.Entry(
                    name: entry.name, dtype: entry.dtype, shape: entry.shape, count: count,
                    byteRange: (bufferStart + entry.start)..<(bufferStart + entry.end)
                ))
        }
        return Header(index: SafetensorsIndex(entries: located, metadata: metadata), dataStart: bufferStart, dataSize: cursor)
    }

    private static func halfToFloat(_ h: UInt16) -> Float {
        let sign = UInt32(h >> 15) << 31
        let exponent = Int((h >> 10) & 0x1F)
        let mantissa = UInt32(h & 0x3FF)
        if exponent == 0 {
            return Float(sign: sign == 0 ? .plus : .minus, exponent: -24, significand: Float(mantissa))
        }
        if exponent == 31 {
            return Float(bitPattern: sign | 0x7F80_0000 | (mantissa << 13))
        }
        return Float(bitPattern: sign | (UInt32(exponent - 15 + 127) << 23) | (mantissa << 13))
    }

    static func jsonString(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out += "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count) + String(scalar.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}

/// A checked safetensors header: where each tensor lies in the bytes it was read from.
public struct SafetensorsIndex: Sendable, Hashable {
    /// One tensor's place.
    public struct Entry: Sendable, Hashable {
        /// The tensor's name.
        public var name: String
        /// Its element type.
        public var dtype: DType
        /// Its shape.
        public var shape: [Int]
        /// Its element count.
        public var count: Int
        /// Its bytes, as indices into the whole file (header included).
        public var byteRange: Range<Int>
    }

    /// The tensors, ordered by their position in the file.
    public var entries: [Entry]
    /// The `__metadata__` string pairs.
    public var metadata: [String: String]
}

/// The decoded contents of a safetensors file.
public struct SafetensorsArchive: Sendable, Hashable {
    /// The tensors, ordered by their position in the file.
    public var tensors: [TensorRecord]
    /// The `__metadata__` string pairs.
    public var metadata: [String: String]

    /// Creates an archive.
    public init(tensors: [TensorRecord], metadata: [String: String] = [:]) {
        self.tensors = tensors
        self.metadata = metadata
    }

    /// The tensor with `name`, if present.
    public subscript(name: String) -> TensorRecord? {
        tensors.first { $0.name == name }
    }

    /// The tensors keyed by name.
    public var byName: [String: TensorRecord] {
        Dictionary(uniqueKeysWithValues: tensors.map { ($0.name, $0) })
    }

    /// Checks that the archive holds exactly the expected tensors with the expected shapes.
    /// - Parameter expected: Name → shape of every tensor that must be present.
    public func validate(against expected: [String: [Int]]) throws(FormatError) {
        let present = byName
        for name in expected.keys.sorted() {
            guard let tensor = present[name] else {
                throw FormatError(.missingTensor, "tensor '\(name)' is missing")
            }
            let shape = expected[name]!
            guard tensor.shape == shape else {
                throw FormatError(.shapeMismatch, "tensor '\(name)' has shape \(tensor.shape); expected \(shape)")
            }
        }
        if let extra = present.keys.sorted().first(where: { expected[$0] == nil }) {
            throw FormatError(.unexpectedTensor, "tensor '\(extra)' is not part of the model")
        }
    }

    /// Encodes the archive back to safetensors bytes.
    public func encoded() -> [UInt8] { Safetensors.encode(tensors, metadata: metadata) }
}
