import COrchardKernels
import Dispatch

/// Orchard's AVX2/FMA kernels (`COrchardKernels`), unpacked: `A · Bᵀ` as dot products of rows, `op(A) · B` as
/// rows of B scaled by entries of A; with `wide`, their AVX-512F counterparts (16-wide vectors, taller tiles). Products
/// with both operands transposed are not covered (``GEMM`` sends them elsewhere).
enum AVX2GEMM {
    /// Whether this build has the kernels and the CPU can run them.
    static let isAvailable: Bool = orchard_avx2_available()
    /// Whether the CPU can also run the AVX-512 kernels.
    static let isAVX512Available: Bool = isAvailable && orchard_avx512_available()
    /// Whether the CPU has the AVX-512 subsets of Intel's Skylake-SP (F, CD, BW, DQ, VL): what OpenBLAS's SkylakeX
    /// kernels need.
    static let hasSkylakeAVX512Subsets: Bool = isAVX512Available && orchard_avx512_skylake_subsets_available()

    /// Fewest rows (or columns) of C per thread worth a thread of its own.
    static let rowsPerThread = 64
    /// Column blocks start at multiples of this, so that every block but the last fills whole vectors.
    static let columnAlignment = 16
    /// Fewest multiply-adds worth splitting by columns (below, starting the second thread costs more than it saves:
    /// batch-10 products ran 17 % slower split).
    static let columnSplitMinimum = 1 << 22

    /// `C = alpha · op(A) · op(B) + beta · C`; `transposeA && transposeB` is not supported. With `threads` > 1, the
    /// rows of C are split between threads, or its columns when there are too few rows (a short batch's gradient):
    /// either way every element is computed as on one thread, so the result does not depend on the split.
    static func multiply(
        transposeA: Bool, transposeB: Bool, m: Int, n: Int, k: Int, alpha: Float,
        a: UnsafePointer<Float>, lda: Int, b: UnsafePointer<Float>, ldb: Int,
        beta: Float, c: UnsafeMutablePointer<Float>, ldc: Int, threads: Int, wide: Bool = false
    ) {
        precondition(isAvailable && !(transposeA && transposeB), "AVX2 kernels called for an unsupported product")
        precondition(!wide || isAVX512Available, "AVX-512 kernels called on a CPU without AVX-512F")
        let byRows = max(1, min(threads, m / rowsPerThread))
        let byColumns = m * n * k < columnSplitMinimum ? 1 : max(1, min(threads, n / rowsPerThread))
        let aAddress = UInt(bitPattern: a), bAddress = UInt(bitPattern: b), cAddress = UInt(bitPattern: c)
        if byRows == 1 && byColumns > 1 {
            // Blocks of whole vectors: column j of C needs row j of B (A · Bᵀ) or its column j (op(A) · B).
            let blocks = (n + columnAlignment - 1) / columnAlignment
            DispatchQueue.concurrentPerform(iterations: byColumns) { worker in
                let j0 = min(n, blocks * worker / byColumns * columnAlignment)
                let j1 = min(n, blocks * (worker + 1) / byColumns * columnAlignment)
                let b = UnsafePointer<Float>(bitPattern: bAddress)!
                run(
                    transposeA: transposeA, transposeB: transposeB, rows: 0..<m, n: j1 - j0, k: k, alpha: alpha,
                    a: UnsafePointer(bitPattern: aAddress)!, lda: lda, b: transposeB ? b + j0 * ldb : b + j0, ldb: ldb,
                    beta: beta, c: UnsafeMutablePointer<Float>(bitPattern: cAddress)! + j0, ldc: ldc, wide: wide)
            }
            return
        }
        if byRows == 1 {
            run(
                transposeA: transposeA, transposeB: transposeB, rows: 0..<m, n: n, k: k, alpha: alpha,
                a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc, wide: wide)
            return
        }
        DispatchQueue.concurrentPerform(iterations: byRows) { worker in
            run(
                transposeA: transposeA, transposeB: transposeB,
                rows: (m * worker / byRows)..<(m * (worker + 1) / byRows), n: n, k: k, alpha: alpha,
                a: UnsafePointer(bitPattern: aAddress)!, lda: lda, b: UnsafePointer(bitPattern: bAddress)!, ldb: ldb,
                beta: beta, c: UnsafeMutablePointer(bitPattern: cAddress)!, ldc: ldc, wide: wide)
        }
    }

    /// Rows `rows` of C.
    private static func run(
        transposeA: Bool, transposeB: Bool, rows: Range<Int>, n: Int, k: Int, alpha: Float,
        a: UnsafePointer<Float>, lda: Int, b: UnsafePointer<Float>, ldb: Int,
        beta: Float, c: UnsafeMutablePointer<Float>, ldc: Int, wide: Bool
    ) {
        guard !rows.isEmpty, n > 0 else { return }
        let i0 = rows.lowerBound
        let ai = transposeA ? a + i0 : a + i0 * lda
        let ci = c + i0 * ldc
        switch (transposeB, wide) {
        case (true, false): orchard_avx2_sgemm_nt(rows.count, n, k, alpha, ai, lda, b, ldb, beta, ci, ldc)
        case (true, true): orchard_avx512_sgemm_nt(rows.count, n, k, alpha, ai, lda, b, ldb, beta, ci, ldc)
        case (false, false): orchard_avx2_sgemm_xn(transposeA, rows.count, n, k, alpha, ai, lda, b, ldb, beta, ci, ldc)
        case (false, true): orchard_avx512_sgemm_xn(transposeA, rows.count, n, k, alpha, ai, lda, b, ldb, beta, ci, ldc)
        }
    }
}
