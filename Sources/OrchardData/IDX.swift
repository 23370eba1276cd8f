internal import CompressNIO
public import Foundation
import OrchardSupport
internal import NIOCore
public import OrchardML

/// An n-dimensional array read from an IDX file (the MNIST and Fashion-MNIST format), raw or gzip-compressed.
///
/// Layout: two zero bytes, an element-type byte, a dimension-count byte, then each dimension as a big-endian
/// `UInt32`, then the elements, big-endian, row-major. Reading checks the magic number, the element type, that
/// no dimension is zero, and that exactly the announced number of bytes follows.
public struct IDXArray: Sendable, Hashable {
    /// The element type of an IDX array.
    public struct ElementType: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: UInt8, Sendable, Hashable {
            case uint8 = 0x08, int8 = 0x09, int16 = 0x0B, int32 = 0x0C, float32 = 0x0D, float64 = 0x0E
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        init?(code: UInt8) {
            guard let kind = Kind(rawValue: code) else { return nil }
            self.kind = kind
        }

        /// Unsigned bytes (images and labels in MNIST).
        public static let uint8 = ElementType(.uint8)
        /// Signed bytes.
        public static let int8 = ElementType(.int8)
        /// Big-endian 16-bit integers.
        public static let int16 = ElementType(.int16)
        /// Big-endian 32-bit integers.
        public static let int32 = ElementType(.int32)
        /// Big-endian IEEE 754 single precision.
        public static let float32 = ElementType(.float32)
        /// Big-endian IEEE 754 double precision.
        public static let float64 = ElementType(.float64)

        /// The type byte in the file header.
        public var code: UInt8 { kind.rawValue }

        /// Bytes per element.
        public var byteWidth: Int {
            switch kind {
            case .uint8, .int8: 1
            case .int16: 2
            case .int32, .float32: 4
            case .float64: 8
            }
        }

        public var description: String { "\(kind)" }
    }

    /// The element type.
    public let elementType: ElementType
    /// The dimensions, outermost first.
    public let shape: [Int]
    /// The elements' bytes as stored (big-endian), without the header.
    public let payload: [UInt8]

    /// Number of elements.
    public var elementCount: Int { shape.reduce(1, *) }

    /// Creates an array from its parts (e.g. to write a file).
    /// - Parameters:
    ///   - elementType: The element type.
    ///   - shape: Positive dimensions, at most 255 of them.
    ///   - payload: `shape.reduce(1, *) × elementType.byteWidth` big-endian bytes.
    public init(elementType: ElementType, shape: [Int], payload: [UInt8]) throws(DataError) {
        guard !shape.isEmpty, shape.count <= 255, shape.allSatisfy({ $0 > 0 && $0 <= Int(UInt32.max) }) else {
            throw DataError(.invalidIDX, "shape \(shape) is not a valid IDX shape")
        }
        let expected = try Self.payloadByteCount(shape: shape, type: elementType)
        guard payload.count == expected else {
            throw DataError(.sizeMismatch, "IDX payload has \(payload.count) bytes; shape \(shape) of \(elementType) needs \(expected)")
        }
        self.elementType = elementType
        self.shape = shape
        self.payload = payload
    }

    /// Reads an IDX file; gzip is detected from its magic bytes.
    /// - Parameters:
    ///   - url: The file, raw or gzip-compressed.
    ///   - cache: Where a decompressed copy of a gzip file is kept for the next read (none by default).
    public init(contentsOf url: URL, cache: IDXCache? = nil) throws(DataError) {
        let entry = cache?.entryPath(for: url)
        if let cache, let entry, let cached = cache.read(entry) {
            self = cached
            return
        }
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw DataError(.unreadable, "cannot read \(url.path): \(FileAccessError(error).message)")
        }
        do {
            let bytes = [UInt8](data)
            guard bytes.starts(with: [0x1F, 0x8B]) else {
                try self.init(bytes: bytes)
                return
            }
            let raw = try Self.gunzip(bytes)
            try self.init(bytes: raw)
            // Only a copy that parsed is kept.
            if let cache, let entry { cache.store(raw, at: entry) }
        } catch {
            throw DataError(error.code, "\(url.lastPathComponent): \(error.message)")
        }
    }

    /// Parses IDX bytes, raw or gzip-compressed.
    public init(bytes: [UInt8]) throws(DataError) {
        let raw = bytes.starts(with: [0x1F, 0x8B]) ? try Self.gunzip(bytes) : bytes
        let header = try Self.header(raw)
        guard raw.count - header.size == header.payloadBytes else {
            throw DataError(
                .sizeMismatch, "shape \(header.shape) of \(header.type) needs \(header.payloadBytes) bytes after the header, found \(raw.count - header.size)")
        }
        try self.init(elementType: header.type, shape: header.shape, payload: Array(raw[header.size...]))
    }

    /// An IDX file's header: the element type, the shape, the header's own size (4 + 4 × rank) and the payload's.
    struct Header {
        var type: ElementType
        var shape: [Int]
        var size: Int
        var payloadBytes: Int
    }

    /// Parses the header at the start of `raw`, which may hold the header only (``IDXCache`` reads it first).
    /// - Throws: `invalid_idx` for a bad magic number, element type or dimension, a cut header, or a shape whose
    ///   payload size does not fit in memory's address range.
    static func header(_ raw: [UInt8]) throws(DataError) -> Header {
        guard raw.count >= 4 else { throw DataError(.invalidIDX, "\(raw.count) bytes is too short for an IDX header") }
        guard raw[0] == 0, raw[1] == 0 else {
            throw DataError(.invalidIDX, String(format: "magic number starts 0x%02X%02X, expected 0x0000", raw[0], raw[1]))
        }
        guard let type = ElementType(code: raw[2]) else {
            throw DataError(.invalidIDX, String(format: "unknown element type 0x%02X", raw[2]))
        }
        let rank = Int(raw[3])
        guard rank > 0 else { throw DataError(.invalidIDX, "IDX array has no dimensions") }
        let size = 4 + 4 * rank
        guard raw.count >= size else {
            throw DataError(.invalidIDX, "header announces \(rank) dimensions but the file has only \(raw.count) bytes")
        }
        var shape: [Int] = []
        for d in 0..<rank {
            let o = 4 + 4 * d
            let high = Int(raw[o]) << 24 | Int(raw[o + 1]) << 16
            let dimension = high | Int(raw[o + 2]) << 8 | Int(raw[o + 3])
            guard dimension > 0 else { throw DataError(.invalidIDX, "dimension \(d) is zero") }
            shape.append(dimension)
        }
        return Header(type: type, shape: shape, size: size, payloadBytes: try payloadByteCount(shape: shape, type: type))
    }

    /// The payload's size for `shape` of `type`.
    /// - Throws: `invalid_idx` when it overflows (a header can announce up to 255 dimensions of 2³² − 1 each).
    static func payloadByteCount(shape: [Int], type: ElementType) throws(DataError) -> Int {
        var total = type.byteWidth
        for dimension in shape {
            let (product, overflow) = total.multipliedReportingOverflow(by: dimension)
            guard !overflow else { throw DataError(.invalidIDX, "shape \(shape) of \(type) is too large to hold") }
            total = product
        }
        return total
    }

    /// The file bytes: header and payload, uncompressed.
    public var encoded: [UInt8] {
        var out: [UInt8] = [0, 0, elementType.code, UInt8(shape.count)]
        for size in shape { out += [UInt8(size >> 24 & 0xFF), UInt8(size >> 16 & 0xFF), UInt8(size >> 8 & 0xFF), UInt8(size & 0xFF)] }
        return out + payload
    }

    /// The elements converted to `Float`, in row-major order.
    public func floats() -> [Float] {
        let n = elementCount
        return payload.withUnsafeBufferPointer { p in
            (0..<n).map { i -> Float in
                func be(_ width: Int) -> UInt64 { (0..<width).reduce(0) { $0 << 8 | UInt64(p[i * width + $1]) } }
                switch elementType {
                case .uint8: return Float(p[i])
                case .int8: return Float(Int8(bitPattern: p[i]))
                case .int16: return Float(Int16(bitPattern: UInt16(be(2))))
                case .int32: return Float(Int32(bitPattern: UInt32(be(4))))
                case .float32: return Float(bitPattern: UInt32(be(4)))
                default: return Float(Double(bitPattern: be(8)))
                }
            }
        }
    }

    private static func gunzip(_ bytes: [UInt8]) throws(DataError) -> [UInt8] {
        // zlib (through CompressNIO) checks the 8-byte trailer (CRC-32 and size mod 2³² of the uncompressed data)
        // when it reaches the end of the stream, and refuses a mismatch; but it stops quietly at the end of a
        // truncated stream, so the size is checked here as well: the last four bytes of a cut stream are not its
        // size.
        let n = bytes.count
        guard n >= 18 else { throw DataError(.unreadable, "gzip data of \(n) bytes is truncated") }
        let expectedSize = UInt32(bytes[n - 4]) | UInt32(bytes[n - 3]) << 8 | UInt32(bytes[n - 2]) << 16 | UInt32(bytes[n - 1]) << 24
        var input = ByteBuffer(bytes: bytes)
        let output: [UInt8]
        do {
            // Deflate expands at most ~1032:1, which bounds the allocation a corrupt size field could ask for.
            let capacity = min(Int(expectedSize), n * 1032 + 1024)
            var buffer = ByteBufferAllocator().buffer(capacity: capacity)
            do {
                try input.decompress(to: &buffer, with: .gzip())
            } catch let error as CompressNIOError where error == .bufferOverflow {
                // The size field wrapped (data over 4 GiB) or lies: decompress with growing buffers instead.
                input.moveReaderIndex(to: 0)
                buffer = try input.decompress(with: .gzip())
            }
            output = Array(buffer.readableBytesView)
        } catch {
            throw DataError(.unreadable, "gzip data is corrupt: \(error)")
        }
        guard UInt32(truncatingIfNeeded: output.count) == expectedSize else {
            throw DataError(.unreadable, "gzip data is truncated or corrupt (its size does not match its trailer)")
        }
        return output
    }
}

/// An image-classification dataset from a pair of IDX files (images `[N, H, W]` of bytes, labels `[N]` of bytes).
///
/// Pixels stay as bytes in memory (47 MB for Fashion-MNIST's training set, not 188 MB of floats) and are
/// scaled to `[0, 1]` when the trainer copies a sample. Each sample's input has shape `[1, H, W]`
/// (channels-first); its target is the class index as a Float, shape `[1]`.
public struct IDXImageDataset: Dataset, Sendable {
    public let count: Int
    public let inputSpecs: [FeatureSpec]
    public let targetSpec: FeatureSpec
    /// The label of every sample.
    public let labels: [UInt8]
    private let pixels: [UInt8]
    private let pixelsPerImage: Int

    /// Creates a dataset from decoded image and label arrays.
    /// - Parameters:
    ///   - images: A 3-D array of bytes, `[N, H, W]`.
    ///   - labels: A 1-D array of `N` bytes.
    ///   - inputName: The model input the images feed.
    ///   - targetName: The name of the label target.
    public init(images: IDXArray, labels: IDXArray, inputName: String = "image", targetName: String = "label") throws(DataError) {
        guard images.elementType == .uint8, images.shape.count == 3 else {
            throw DataError(.invalidIDX, "images must be a 3-D array of uint8, found \(images.shape.count)-D \(images.elementType)")
        }
        guard labels.elementType == .uint8, labels.shape.count == 1 else {
            throw DataError(.invalidIDX, "labels must be a 1-D array of uint8, found \(labels.shape.count)-D \(labels.elementType)")
        }
        guard images.shape[0] == labels.shape[0] else {
            throw DataError(.sizeMismatch, "\(images.shape[0]) images but \(labels.shape[0]) labels")
        }
        count = labels.shape[0]
        pixelsPerImage = images.shape[1] * images.shape[2]
        inputSpecs = [FeatureSpec(name: inputName, shape: [1, images.shape[1], images.shape[2]])]
        targetSpec = FeatureSpec(name: targetName, shape: [1])
        pixels = images.payload
        self.labels = labels.payload
    }

    /// Reads a pair of IDX files (raw or gzip).
    /// - Parameters:
    ///   - images: The images file (`[N, H, W]` bytes), raw or gzip-compressed.
    ///   - labels: The labels file (`[N]` bytes), raw or gzip-compressed.
    ///   - inputName: The name of the model input the images feed.
    ///   - cache: Where decompressed copies of gzip files are kept for the next read (none by default).
    public init(imagesAt images: URL, labelsAt labels: URL, inputName: String = "image", cache: IDXCache? = nil) throws(DataError) {
        try self.init(images: try IDXArray(contentsOf: images, cache: cache), labels: try IDXArray(contentsOf: labels, cache: cache), inputName: inputName)
    }

    /// Which half of an MNIST-layout directory to read.
    public struct Split: Sendable, Hashable {
        let prefix: String
        /// The training files, `train-images-idx3-ubyte` and `train-labels-idx1-ubyte`.
        public static let train = Split(prefix: "train")
        /// The test files, `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`.
        public static let test = Split(prefix: "t10k")
    }

    /// Where Debian's `dataset-fashion-mnist` package installs Fashion-MNIST.
    public static let fashionMNISTDirectory = URL(fileURLWithPath: "/usr/share/datasets/fashion-mnist")

    /// Reads one split of an MNIST or Fashion-MNIST directory, using the `.gz` files when present and the
    /// uncompressed ones otherwise.
    public init(directory: URL, split: Split, inputName: String = "image", cache: IDXCache? = nil) throws(DataError) {
        func locate(_ stem: String) throws(DataError) -> URL {
            let names = ["\(split.prefix)-\(stem).gz", "\(split.prefix)-\(stem)"]
            for name in names {
                let url = directory.appendingPathComponent(name)
                if FileManager.default.fileExists(atPath: url.path) { return url }
            }
            throw DataError(.unreadable, "neither \(names.joined(separator: " nor ")) exists in \(directory.path)")
        }
        try self.init(imagesAt: try locate("images-idx3-ubyte"), labelsAt: try locate("labels-idx1-ubyte"), inputName: inputName, cache: cache)
    }

    public func copyInput(_ input: Int, of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        let start = index * pixelsPerImage
        let count = pixelsPerImage
        precondition(destination.count >= count, "a destination of \(destination.count) values for an image of \(count) pixels")
        guard count > 0, let out = destination.baseAddress else { return }
        pixels.withUnsafeBufferPointer { p in
            // `Float(v) / 255`, 16 pixels at a time (a vector division rounds as the scalar one does): the look-up table
            // it replaces gathered one pixel at a time, 6 % of a simulation's time.
            let source = UnsafeRawPointer(p.baseAddress! + start)
            let target = UnsafeMutableRawPointer(out)
            var j = 0
            while j + 16 <= count {
                let bytes = source.loadUnaligned(fromByteOffset: j, as: SIMD16<UInt8>.self)
                let scaled = SIMD16<Float>(SIMD16<Int32>(truncatingIfNeeded: bytes)) / 255
                target.storeBytes(of: scaled, toByteOffset: j * MemoryLayout<Float>.stride, as: SIMD16<Float>.self)
                j += 16
            }
            while j < count {
                out[j] = Float(p[start + j]) / 255
                j += 1
            }
        }
    }

    public func copyTarget(of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        destination[0] = Float(labels[index])
    }
}
