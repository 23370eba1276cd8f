/// One array of a Flower `ArrayRecord`: a NumPy dtype, a shape and the elements' little-endian bytes in C order.
///
/// The data always holds exactly the shape's elements. On the wire the array travels as its `.npy` file
/// (``NPY``), cut into chunks.
public struct FlowerArray: Sendable, Hashable {
    /// The element type.
    public let dtype: NumPyDType
    /// The shape; `[]` is a scalar (0-d array).
    public let shape: [Int]
    /// The elements, little-endian, in C order.
    public let data: [UInt8]

    /// Creates an array from raw element bytes.
    /// - Throws: ``FlowerError`` `shape_mismatch` when `data` is not exactly the shape's elements (or a dimension
    ///   is negative).
    public init(dtype: NumPyDType, shape: [Int], data: [UInt8]) throws(FlowerError) {
        guard let count = Self.elementCount(shape), count.multipliedReportingOverflow(by: dtype.itemSize) == (data.count, false) else {
            let needed = Self.elementCount(shape).map { "\($0) elements of \(dtype.itemSize) bytes" } ?? "an impossible size"
            throw FlowerError(.shapeMismatch, "\(data.count) bytes of \(dtype) do not fill shape \(shape) (\(needed))")
        }
        self.dtype = dtype
        self.shape = shape
        self.data = data
    }

    /// A `float32` array of `values` (which must fill `shape` exactly).
    public init(_ values: [Float], shape: [Int]) {
        precondition(Self.elementCount(shape) == values.count, "\(values.count) values do not fill shape \(shape)")
        var data: [UInt8] = []
        data.reserveCapacity(values.count * 4)
        for value in values { withUnsafeBytes(of: value.bitPattern.littleEndian) { data.append(contentsOf: $0) } }
        self.dtype = .float32
        self.shape = shape
        self.data = data
    }

    /// The number of elements.
    public var count: Int { data.count / dtype.itemSize }

    /// The elements as `Float`: `float32` as they are, `float64` rounded to the nearest `Float`.
    /// - Throws: ``FlowerError`` `unsupported_dtype` for any other dtype.
    public func floats() throws(FlowerError) -> [Float] {
        switch dtype {
        case .float32: elements(UInt32.self) { Float(bitPattern: $0) }
        case .float64: elements(UInt64.self) { Float(Double(bitPattern: $0)) }
        default: throw FlowerError(.unsupportedDtype, "an array of \(dtype) with shape \(shape) holds no floats; expected float32 or float64")
        }
    }

    private func elements<Bits: FixedWidthInteger>(_: Bits.Type, _ convert: (Bits) -> Float) -> [Float] {
        data.withUnsafeBytes { raw in
            (0..<count).map { convert(Bits(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * MemoryLayout<Bits>.size, as: Bits.self))) }
        }
    }

    /// The product of `shape`, or nil when a dimension is negative or the product overflows.
    static func elementCount(_ shape: [Int]) -> Int? {
        shape.reduce(Optional(1)) { product, dimension in
            guard let product, dimension >= 0 else { return nil }
            let (result, overflow) = product.multipliedReportingOverflow(by: dimension)
            return overflow ? nil : result
        }
    }
}
