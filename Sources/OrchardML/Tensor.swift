/// A shaped, contiguous, row-major block of Float32 values with value semantics.
///
/// `Tensor` is the engine's currency for parameters, model inputs and outputs. Training itself runs on buffers a
/// compiled plan preallocates; `Tensor` operations allocate and are meant for inference, set-up and tests.
public struct Tensor: Sendable, Hashable, CustomStringConvertible {
    /// The dimensions, outermost first; the empty shape is a scalar.
    public private(set) var shape: [Int]
    /// The values in row-major order.
    public private(set) var scalars: [Float]

    /// Creates a tensor from values that fill `shape` exactly.
    public init(shape: [Int], scalars: [Float]) {
        precondition(shape.allSatisfy { $0 >= 0 }, "negative dimension in shape \(shape)")
        precondition(shape.reduce(1, *) == scalars.count, "\(scalars.count) values do not fill shape \(shape)")
        self.shape = shape
        self.scalars = scalars
    }

    /// Creates a tensor of `shape` with every element `value`.
    public init(shape: [Int], repeating value: Float = 0) {
        self.init(shape: shape, scalars: [Float](repeating: value, count: shape.reduce(1, *)))
    }

    /// Creates a rank-2 tensor from rows of equal length.
    public init(rows: [[Float]]) {
        let width = rows.first?.count ?? 0
        precondition(rows.allSatisfy { $0.count == width }, "rows differ in length")
        self.init(shape: [rows.count, width], scalars: rows.flatMap { $0 })
    }

    /// Number of elements.
    public var count: Int { scalars.count }
    /// Number of dimensions.
    public var rank: Int { shape.count }

    /// The element at a multi-dimensional index.
    public subscript(_ index: Int...) -> Float {
        get { scalars[flatIndex(index)] }
        set { scalars[flatIndex(index)] = newValue }
    }

    private func flatIndex(_ index: [Int]) -> Int {
        precondition(index.count == shape.count, "index \(index) does not match shape \(shape)")
        var flat = 0
        for (i, d) in zip(index, shape) {
            precondition(i >= 0 && i < d, "index \(index) out of bounds for shape \(shape)")
            flat = flat * d + i
        }
        return flat
    }

    /// The same values under another shape with the same element count.
    public func reshaped(_ newShape: [Int]) -> Tensor {
        Tensor(shape: newShape, scalars: scalars)
    }

    /// Row `i` of the outermost dimension, as a tensor of the remaining shape.
    public func row(_ i: Int) -> Tensor {
        precondition(rank >= 1 && i >= 0 && i < shape[0], "row \(i) out of bounds for shape \(shape)")
        let width = count / shape[0]
        return Tensor(shape: Array(shape.dropFirst()), scalars: Array(scalars[(i * width)..<((i + 1) * width)]))
    }

    /// Calls `body` with read access to the values.
    public func withUnsafeBufferPointer<R>(_ body: (UnsafeBufferPointer<Float>) throws -> R) rethrows -> R {
        try scalars.withUnsafeBufferPointer(body)
    }

    /// Calls `body` with write access to the values.
    public mutating func withUnsafeMutableBufferPointer<R>(_ body: (inout UnsafeMutableBufferPointer<Float>) throws -> R) rethrows -> R {
        try scalars.withUnsafeMutableBufferPointer(body)
    }

    /// Matrix product of two rank-2 tensors, `self · other`, through ``GEMM``.
    public func matmul(_ other: Tensor, transposeSelf: Bool = false, transposeOther: Bool = false) -> Tensor {
        precondition(rank == 2 && other.rank == 2, "matmul needs rank-2 tensors, got \(shape) and \(other.shape)")
        let m = transposeSelf ? shape[1] : shape[0]
        let k = transposeSelf ? shape[0] : shape[1]
        let k2 = transposeOther ? other.shape[1] : other.shape[0]
        let n = transposeOther ? other.shape[0] : other.shape[1]
        precondition(k == k2, "matmul inner dimensions differ: \(shape) and \(other.shape)")
        var out = Tensor(shape: [m, n])
        scalars.withUnsafeBufferPointer { a in
            other.scalars.withUnsafeBufferPointer { b in
                out.scalars.withUnsafeMutableBufferPointer { c in
                    GEMM.multiply(
                        transposeA: transposeSelf, transposeB: transposeOther, m: m, n: n, k: k,
                        a: a.baseAddress!, lda: shape[1], b: b.baseAddress!, ldb: other.shape[1],
                        c: c.baseAddress!, ldc: n
                    )
                }
            }
        }
        return out
    }

    /// The tensor with `transform` applied to every element.
    public func map(_ transform: (Float) -> Float) -> Tensor {
        Tensor(shape: shape, scalars: scalars.map(transform))
    }

    /// Element-wise combination of two tensors of equal shape.
    public func zipWith(_ other: Tensor, _ combine: (Float, Float) -> Float) -> Tensor {
        precondition(shape == other.shape, "shapes differ: \(shape) and \(other.shape)")
        // An indexed loop over the buffers: `zip(_:_:).map` grows its result element by element.
        let count = scalars.count
        let values = [Float](unsafeUninitializedCapacity: count) { out, initialized in
            scalars.withUnsafeBufferPointer { a in
                other.scalars.withUnsafeBufferPointer { b in
                    for i in 0..<count { out[i] = combine(a[i], b[i]) }
                }
            }
            initialized = count
        }
        return Tensor(shape: shape, scalars: values)
    }

    /// Element-wise sum.
    public static func + (lhs: Tensor, rhs: Tensor) -> Tensor { lhs.zipWith(rhs, +) }
    /// Element-wise difference.
    public static func - (lhs: Tensor, rhs: Tensor) -> Tensor { lhs.zipWith(rhs, -) }
    /// Element-wise product.
    public static func * (lhs: Tensor, rhs: Tensor) -> Tensor { lhs.zipWith(rhs, *) }
    /// Every element scaled.
    public static func * (lhs: Tensor, rhs: Float) -> Tensor { lhs.map { $0 * rhs } }

    /// Sum of all elements (accumulated in Double).
    public func sum() -> Float { Float(scalars.reduce(0.0) { $0 + Double($1) }) }
    /// Mean of all elements.
    public func mean() -> Float { count == 0 ? 0 : Float(scalars.reduce(0.0) { $0 + Double($1) } / Double(count)) }

    /// For a rank-2 tensor, the column index of each row's largest element.
    public func argmaxRows() -> [Int] {
        precondition(rank == 2, "argmaxRows needs a rank-2 tensor, got \(shape)")
        let width = shape[1]
        return (0..<shape[0]).map { r in
            var best = 0
            for c in 1..<max(width, 1) where scalars[r * width + c] > scalars[r * width + best] { best = c }
            return best
        }
    }

    public var description: String { "Tensor(shape: \(shape), scalars: \(scalars.prefix(8))\(count > 8 ? "…" : ""))" }
}
