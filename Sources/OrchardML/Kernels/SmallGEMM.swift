/// Unpacked kernels for products with few rows (a training batch of 10 against a 784 × 200 weight matrix):
/// there, packing the large operand costs more than multiplying it, so these read both operands in place.
enum SmallGEMM {
    /// Largest `m` the unpacked kernels take.
    static let maximumRows = 32

    /// C[m × n] += alpha · op(A) · B, with B stored row-major (`k × n`, row stride `ldb`).
    ///
    /// Rows of C go six at a time (a short last group repeats its last row and drops the copies); columns go
    /// sixteen, then eight at a time, then one by one.
    static func multiplyRowsOfB(
        transposeA: Bool, m: Int, n: Int, k: Int, alpha: Float,
        a: UnsafePointer<Float>, lda: Int, b: UnsafePointer<Float>, ldb: Int,
        c: UnsafeMutablePointer<Float>, ldc: Int
    ) {
        typealias V = SIMD8<Float>
        let rowStride = transposeA ? 1 : lda
        let depthStride = transposeA ? lda : 1
        let valpha = V(repeating: alpha)
        var i0 = 0
        while i0 < m {
            let rows = min(6, m - i0)
            let r1 = i0 + min(1, rows - 1), r2 = i0 + min(2, rows - 1), r3 = i0 + min(3, rows - 1)
            let r4 = i0 + min(4, rows - 1), r5 = i0 + min(5, rows - 1)
            let a0 = a + i0 * rowStride, a1 = a + r1 * rowStride, a2 = a + r2 * rowStride
            let a3 = a + r3 * rowStride, a4 = a + r4 * rowStride, a5 = a + r5 * rowStride
            var j = 0
            while j + 16 <= n {
                var c00 = V(), c01 = V(), c10 = V(), c11 = V(), c20 = V(), c21 = V()
                var c30 = V(), c31 = V(), c40 = V(), c41 = V(), c50 = V(), c51 = V()
                var bp = UnsafeRawPointer(b + j)
                var ap = 0
                for _ in 0..<k {
                    let b0 = bp.loadUnaligned(as: V.self)
                    let b1 = bp.loadUnaligned(fromByteOffset: 32, as: V.self)
                    var s = V(repeating: a0[ap]); multiplyAdd(&c00, s, b0); multiplyAdd(&c01, s, b1)
                    s = V(repeating: a1[ap]); multiplyAdd(&c10, s, b0); multiplyAdd(&c11, s, b1)
                    s = V(repeating: a2[ap]); multiplyAdd(&c20, s, b0); multiplyAdd(&c21, s, b1)
                    s = V(repeating: a3[ap]); multiplyAdd(&c30, s, b0); multiplyAdd(&c31, s, b1)
                    s = V(repeating: a4[ap]); multiplyAdd(&c40, s, b0); multiplyAdd(&c41, s, b1)
                    s = V(repeating: a5[ap]); multiplyAdd(&c50, s, b0); multiplyAdd(&c51, s, b1)
                    bp += ldb * 4
                    ap += depthStride
                }
                func store(_ r: Int, _ lo: V, _ hi: V) {
                    let p = UnsafeMutableRawPointer(c + (i0 + r) * ldc + j)
                    p.storeBytes(of: p.loadUnaligned(as: V.self) + valpha * lo, as: V.self)
                    p.storeBytes(of: p.loadUnaligned(fromByteOffset: 32, as: V.self) + valpha * hi, toByteOffset: 32, as: V.self)
                }
                store(0, c00, c01)
                if rows > 1 { store(1, c10, c11) }
                if rows > 2 { store(2, c20, c21) }
                if rows > 3 { store(3, c30, c31) }
                if rows > 4 { store(4, c40, c41) }
                if rows > 5 { store(5, c50, c51) }
                j += 16
            }
            while j + 8 <= n {
                var c0 = V(), c1 = V(), c2 = V(), c3 = V(), c4 = V(), c5 = V()
                var bp = UnsafeRawPointer(b + j)
                var ap = 0
                for _ in 0..<k {
                    let b0 = bp.loadUnaligned(as: V.self)
                    multiplyAdd(&c0, V(repeating: a0[ap]), b0)
                    multiplyAdd(&c1, V(repeating: a1[ap]), b0)
                    multiplyAdd(&c2, V(repeating: a2[ap]), b0)
                    multiplyAdd(&c3, V(repeating: a3[ap]), b0)
                    multiplyAdd(&c4, V(repeating: a4[ap]), b0)
                    multiplyAdd(&c5, V(repeating: a5[ap]), b0)
                    bp += ldb * 4
                    ap += depthStride
                }
                func store(_ r: Int, _ v: V) {
                    let p = UnsafeMutableRawPointer(c + (i0 + r) * ldc + j)
                    p.storeBytes(of: p.loadUnaligned(as: V.self) + valpha * v, as: V.self)
                }
                store(0, c0)
                if rows > 1 { store(1, c1) }
                if rows > 2 { store(2, c2) }
                if rows > 3 { store(3, c3) }
                if rows > 4 { store(4, c4) }
                if rows > 5 { store(5, c5) }
                j += 8
            }
            while j < n {
                for r in 0..<rows {
                    let ar = a + (i0 + r) * rowStride
                    var sum: Float = 0
                    for p in 0..<k { sum += ar[p * depthStride] * b[p * ldb + j] }
                    c[(i0 + r) * ldc + j] += alpha * sum
                }
                j += 1
            }
            i0 += 6
        }
    }

    /// C[m × n] += alpha · A · Bᵀ with A stored row-major (`m × k`) and B stored row-major (`n × k`): every entry
    /// is a dot product of two contiguous rows. Two rows of A meet four rows of B at a time.
    static func multiplyDot(
        m: Int, n: Int, k: Int, alpha: Float,
        a: UnsafePointer<Float>, lda: Int, b: UnsafePointer<Float>, ldb: Int,
        c: UnsafeMutablePointer<Float>, ldc: Int
    ) {
        typealias V = SIMD8<Float>
        let vectorK = k & ~7
        var j0 = 0
        while j0 < n {
            let cols = min(4, n - j0)
            let b0 = UnsafeRawPointer(b + j0 * ldb)
            let b1 = UnsafeRawPointer(b + (j0 + min(1, cols - 1)) * ldb)
            let b2 = UnsafeRawPointer(b + (j0 + min(2, cols - 1)) * ldb)
            let b3 = UnsafeRawPointer(b + (j0 + min(3, cols - 1)) * ldb)
            var i = 0
            while i < m {
                let twoRows = i + 1 < m
                let x0 = UnsafeRawPointer(a + i * lda)
                let x1 = UnsafeRawPointer(a + (twoRows ? i + 1 : i) * lda)
                var s00 = V(), s01 = V(), s02 = V(), s03 = V()
                var s10 = V(), s11 = V(), s12 = V(), s13 = V()
                var offset = 0
                while offset < vectorK * 4 {
                    let w0 = b0.loadUnaligned(fromByteOffset: offset, as: V.self)
                    let w1 = b1.loadUnaligned(fromByteOffset: offset, as: V.self)
                    let w2 = b2.loadUnaligned(fromByteOffset: offset, as: V.self)
                    let w3 = b3.loadUnaligned(fromByteOffset: offset, as: V.self)
                    let v0 = x0.loadUnaligned(fromByteOffset: offset, as: V.self)
                    let v1 = x1.loadUnaligned(fromByteOffset: offset, as: V.self)
                    multiplyAdd(&s00, v0, w0); multiplyAdd(&s01, v0, w1); multiplyAdd(&s02, v0, w2); multiplyAdd(&s03, v0, w3)
                    multiplyAdd(&s10, v1, w0); multiplyAdd(&s11, v1, w1); multiplyAdd(&s12, v1, w2); multiplyAdd(&s13, v1, w3)
                    offset += 32
                }
                var t0 = SIMD4<Float>(s00.sum(), s01.sum(), s02.sum(), s03.sum())
                var t1 = SIMD4<Float>(s10.sum(), s11.sum(), s12.sum(), s13.sum())
                for p in vectorK..<k {
                    let o = p * 4
                    let w = SIMD4<Float>(
                        b0.load(fromByteOffset: o, as: Float.self), b1.load(fromByteOffset: o, as: Float.self),
                        b2.load(fromByteOffset: o, as: Float.self), b3.load(fromByteOffset: o, as: Float.self))
                    t0 += x0.load(fromByteOffset: o, as: Float.self) * w
                    t1 += x1.load(fromByteOffset: o, as: Float.self) * w
                }
                for col in 0..<cols {
                    c[i * ldc + j0 + col] += alpha * t0[col]
                    if twoRows { c[(i + 1) * ldc + j0 + col] += alpha * t1[col] }
                }
                i += 2
            }
            j0 += 4
        }
    }
}
