import Dispatch
import Synchronization

/// Orchard's own single-precision matrix multiply: operands are packed into cache-sized blocks and a
/// 6 × 16 register-tiled SIMD micro-kernel accumulates each tile (the Goto/BLIS scheme).
@usableFromInline
enum PortableGEMM {
    static let mr = 6
    static let nr = 16
    static let kc = 256
    static let mc = 72
    static let nc = 2048

    /// Reusable packing buffers, so steady-state multiplies allocate nothing.
    final class Workspace: @unchecked Sendable {
        let packedA: UnsafeMutablePointer<Float>
        let packedB: UnsafeMutablePointer<Float>
        init() {
            packedA = .allocate(capacity: PortableGEMM.mc * PortableGEMM.kc)
            packedB = .allocate(capacity: PortableGEMM.kc * PortableGEMM.nc)
        }
        deinit {
            packedA.deallocate()
            packedB.deallocate()
        }
    }

    private static let pool = Mutex<[Workspace]>([])

    static func takeWorkspace() -> Workspace {
        pool.withLock { $0.popLast() } ?? Workspace()
    }

    static func returnWorkspace(_ w: Workspace) {
        pool.withLock { $0.append(w) }
    }

    @usableFromInline
    static func multiply(
        transposeA: Bool, transposeB: Bool, m: Int, n: Int, k: Int, alpha: Float,
        a: UnsafePointer<Float>, lda: Int, b: UnsafePointer<Float>, ldb: Int,
        beta: Float, c: UnsafeMutablePointer<Float>, ldc: Int, threads: Int
    ) {
        scale(c: c, m: m, n: n, ldc: ldc, beta: beta)
        guard k > 0, alpha != 0 else { return }
        if m <= SmallGEMM.maximumRows {
            if !transposeB {
                SmallGEMM.multiplyRowsOfB(
                    transposeA: transposeA, m: m, n: n, k: k, alpha: alpha,
                    a: a, lda: lda, b: b, ldb: ldb, c: c, ldc: ldc)
                return
            }
            if !transposeA {
                SmallGEMM.multiplyDot(m: m, n: n, k: k, alpha: alpha, a: a, lda: lda, b: b, ldb: ldb, c: c, ldc: ldc)
                return
            }
        }
        let columnBlocks = (n + nc - 1) / nc
        let rowBlocks = (m + mc - 1) / mc
        // Parallelise over row blocks when there are several; each worker packs its own A and B.
        let workers = max(1, min(threads, rowBlocks))
        if workers == 1 {
            let w = takeWorkspace()
            defer { returnWorkspace(w) }
            for jc in 0..<columnBlocks {
                blockColumn(
                    jc: jc, rowRange: 0..<rowBlocks, w: w, transposeA: transposeA, transposeB: transposeB,
                    m: m, n: n, k: k, alpha: alpha, a: a, lda: lda, b: b, ldb: ldb, c: c, ldc: ldc)
            }
            return
        }
        let aAddress = UInt(bitPattern: a), bAddress = UInt(bitPattern: b), cAddress = UInt(bitPattern: c)
        DispatchQueue.concurrentPerform(iterations: workers) { worker in
            let lo = rowBlocks * worker / workers
            let hi = rowBlocks * (worker + 1) / workers
            guard lo < hi else { return }
            let w = takeWorkspace()
            defer { returnWorkspace(w) }
            for jc in 0..<columnBlocks {
                blockColumn(
                    jc: jc, rowRange: lo..<hi, w: w, transposeA: transposeA, transposeB: transposeB,
                    m: m, n: n, k: k, alpha: alpha,
                    a: UnsafePointer(bitPattern: aAddress)!, lda: lda,
                    b: UnsafePointer(bitPattern: bAddress)!, ldb: ldb,
                    c: UnsafeMutablePointer(bitPattern: cAddress)!, ldc: ldc)
            }
        }
    }

    private static func blockColumn(
        jc: Int, rowRange: Range<Int>, w: Workspace, transposeA: Bool, transposeB: Bool,
        m: Int, n: Int, k: Int, alpha: Float,
        a: UnsafePointer<Float>, lda: Int, b: UnsafePointer<Float>, ldb: Int,
        c: UnsafeMutablePointer<Float>, ldc: Int
    ) {
        let j0 = jc * nc
        let ncur = min(nc, n - j0)
        var p0 = 0
        while p0 < k {
            let kcur = min(kc, k - p0)
            packB(transposeB: transposeB, b: b, ldb: ldb, p0: p0, kcur: kcur, j0: j0, ncur: ncur, into: w.packedB)
            for ib in rowRange {
                let i0 = ib * mc
                let mcur = min(mc, m - i0)
                packA(transposeA: transposeA, a: a, lda: lda, i0: i0, mcur: mcur, p0: p0, kcur: kcur, alpha: alpha, into: w.packedA)
                var jr = 0
                while jr < ncur {
                    let ncols = min(nr, ncur - jr)
                    var ir = 0
                    while ir < mcur {
                        let nrows = min(mr, mcur - ir)
                        microKernel(
                            kcur: kcur,
                            a: w.packedA + ir * kcur,
                            b: w.packedB + jr * kcur,
                            c: c + (i0 + ir) * ldc + j0 + jr, ldc: ldc, rows: nrows, cols: ncols
                        )
                        ir += mr
                    }
                    jr += nr
                }
            }
            p0 += kcur
        }
    }

    private static func scale(c: UnsafeMutablePointer<Float>, m: Int, n: Int, ldc: Int, beta: Float) {
        if beta == 1 { return }
        for i in 0..<m {
            let row = c + i * ldc
            if beta == 0 {
                row.update(repeating: 0, count: n)
            } else {
                for j in 0..<n { row[j] *= beta }
            }
        }
    }

    /// Packs op(A)[i0..<i0+mcur, p0..<p0+kcur] · alpha into panels of `mr` rows: panel r holds, for each p,
    /// the `mr` values of its rows (zero-padded).
    @inline(__always)
    private static func packA(
        transposeA: Bool, a: UnsafePointer<Float>, lda: Int, i0: Int, mcur: Int, p0: Int, kcur: Int,
        alpha: Float, into dst: UnsafeMutablePointer<Float>
    ) {
        var ir = 0
        var out = dst
        while ir < mcur {
            let rows = min(mr, mcur - ir)
            if rows < mr { out.update(repeating: 0, count: kcur * mr) }
            if transposeA {
                // Row p of the stored A holds op(A)'s column p: copy `rows` contiguous values per p.
                for p in 0..<kcur {
                    let src = a + (p0 + p) * lda + i0 + ir
                    for r in 0..<rows { out[p * mr + r] = alpha * src[r] }
                }
            } else {
                for r in 0..<rows {
                    let src = a + (i0 + ir + r) * lda + p0
                    for p in 0..<kcur { out[p * mr + r] = alpha * src[p] }
                }
            }
            out += kcur * mr
            ir += mr
        }
    }

    /// Packs op(B)[p0..<p0+kcur, j0..<j0+ncur] into panels of `nr` columns: panel j holds, for each p, the
    /// `nr` values of its columns (zero-padded).
    @inline(__always)
    private static func packB(
        transposeB: Bool, b: UnsafePointer<Float>, ldb: Int, p0: Int, kcur: Int, j0: Int, ncur: Int,
        into dst: UnsafeMutablePointer<Float>
    ) {
        var jr = 0
        var out = dst
        while jr < ncur {
            let cols = min(nr, ncur - jr)
            if !transposeB && cols == nr {
                for p in 0..<kcur {
                    let src = b + (p0 + p) * ldb + j0 + jr
                    UnsafeMutableRawPointer(out).storeBytes(
                        of: UnsafeRawPointer(src).loadUnaligned(as: SIMD16<Float>.self), as: SIMD16<Float>.self)
                    out += nr
                }
            } else if transposeB {
                // Column j of op(B) is row j of the stored B: read it contiguously, write with stride nr.
                for j in 0..<nr {
                    if j < cols {
                        let src = b + (j0 + jr + j) * ldb + p0
                        for p in 0..<kcur { out[p * nr + j] = src[p] }
                    } else {
                        for p in 0..<kcur { out[p * nr + j] = 0 }
                    }
                }
                out += kcur * nr
            } else {
                for p in 0..<kcur {
                    let src = b + (p0 + p) * ldb + j0 + jr
                    for j in 0..<nr { out[j] = j < cols ? src[j] : 0 }
                    out += nr
                }
            }
            jr += nr
        }
    }

    /// C[rows × cols] += Apanel · Bpanel over `kcur`, with a 6 × 16 tile of accumulators.
    @inline(__always)
    private static func microKernel(
        kcur: Int, a: UnsafePointer<Float>, b: UnsafePointer<Float>,
        c: UnsafeMutablePointer<Float>, ldc: Int, rows: Int, cols: Int
    ) {
        typealias V = SIMD8<Float>
        var c00 = V(), c01 = V(), c10 = V(), c11 = V(), c20 = V(), c21 = V()
        var c30 = V(), c31 = V(), c40 = V(), c41 = V(), c50 = V(), c51 = V()
        let braw = UnsafeRawPointer(b)
        var pa = a
        var offset = 0
        for _ in 0..<kcur {
            let b0 = braw.loadUnaligned(fromByteOffset: offset, as: V.self)
            let b1 = braw.loadUnaligned(fromByteOffset: offset + 32, as: V.self)
            var s = V(repeating: pa[0]); multiplyAdd(&c00, s, b0); multiplyAdd(&c01, s, b1)
            s = V(repeating: pa[1]); multiplyAdd(&c10, s, b0); multiplyAdd(&c11, s, b1)
            s = V(repeating: pa[2]); multiplyAdd(&c20, s, b0); multiplyAdd(&c21, s, b1)
            s = V(repeating: pa[3]); multiplyAdd(&c30, s, b0); multiplyAdd(&c31, s, b1)
            s = V(repeating: pa[4]); multiplyAdd(&c40, s, b0); multiplyAdd(&c41, s, b1)
            s = V(repeating: pa[5]); multiplyAdd(&c50, s, b0); multiplyAdd(&c51, s, b1)
            pa += 6
            offset += 64
        }
        if rows == mr && cols == nr {
            func add(_ row: Int, _ lo: V, _ hi: V) {
                let raw = UnsafeMutableRawPointer(c + row * ldc)
                raw.storeBytes(of: raw.loadUnaligned(as: V.self) + lo, as: V.self)
                raw.storeBytes(of: raw.loadUnaligned(fromByteOffset: 32, as: V.self) + hi, toByteOffset: 32, as: V.self)
            }
            add(0, c00, c01); add(1, c10, c11); add(2, c20, c21)
            add(3, c30, c31); add(4, c40, c41); add(5, c50, c51)
            return
        }
        withUnsafeTemporaryAllocation(of: (V, V).self, capacity: 6) { tile in
            tile[0] = (c00, c01); tile[1] = (c10, c11); tile[2] = (c20, c21)
            tile[3] = (c30, c31); tile[4] = (c40, c41); tile[5] = (c50, c51)
            for r in 0..<rows {
                let (lo, hi) = tile[r]
                let row = c + r * ldc
                for j in 0..<cols { row[j] += j < 8 ? lo[j] : hi[j - 8] }
            }
        }
    }
}
