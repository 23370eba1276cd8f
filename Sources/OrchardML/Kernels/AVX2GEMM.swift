import COrchardKernels
import Dispatch

/// Orchard's AVX2/FMA kernels (`COrchardKernels`), unpacked: `A · Bᵀ` as dot products of rows, `op(A) · B` as
/// rows of B scaled by entries of A. Products with both operands transposed are not covered (``GEMM`` sends
/// them elsewhere).
enum AVX2GEMM {
    /// Whether this build has the kernels and the CPU can run them.
    static let isAvailable: Bool = orchard_avx2_available()

    /// Fewest rows of C per thread worth a thread of its own.
    static let rowsPerThread = 64

    /// `C = alpha · op(A) · op(B) + beta · C`; `transposeA && transposeB` is not supported. With `threads` > 1
    /// and enough rows, the rows of C are split between threads.
    static func multiply(
        transposeA: Bool, transposeB: Bool, m: Int, n: Int, k: Int, alpha: Float,
        a: UnsafePointer<Float>, lda: Int, b: UnsafePointer<Float>, ldb: Int,
        beta: Float, c: UnsafeMutablePointer<Float>, ldc: Int, threads: Int
    ) {
        precondition(isAvailable && !(transposeA && transposeB), "AVX2 kernels called for an unsupported product")
        let workers = max(1, min(threads, m / rowsPerThread))
        if workers == 1 {
            run(transposeA: transposeA, transposeB: transposeB, rows: 0..<m, n: n, k: k, alpha: alpha,
                a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc)
            return
        }
        let aAddress = UInt(bitPattern: a), bAddress = UInt(bitPattern: b), cAddress = UInt(bitPattern: c)
        DispatchQueue.concurrentPerform(iterations: workers) { worker in
            run(transposeA: transposeA, transposeB: transposeB,
                rows: (m * worker / workers)..<(m * (worker + 1) / workers), n: n, k: k, alpha: alpha,
                a: UnsafePointer(bitPattern: aAddress)!, lda: lda, b: UnsafePointer(bitPattern: bAddress)!, ldb: ldb,
                beta: beta, c: UnsafeMutablePointer(bitPattern: cAddress)!, ldc: ldc)
        }
    }

    /// Rows `rows` of C.
    private static func run(
        transposeA: Bool, transposeB: Bool, rows: Range<Int>, n: Int, k: Int, alpha: Float,
        a: UnsafePointer<Float>, lda: Int, b: UnsafePointer<Float>, ldb: Int,
        beta: Float, c: UnsafeMutablePointer<Float>, ldc: Int
    ) {
        guard !rows.isEmpty else { return }
        let i0 = rows.lowerBound
        let ai = transposeA ? a + i0 : a + i0 * lda
        let ci = c + i0 * ldc
        if transposeB {
            orchard_avx2_sgemm_nt(rows.count, n, k, alpha, ai, lda, b, ldb, beta, ci, ldc)
        } else {
            orchard_avx2_sgemm_xn(transposeA, rows.count, n, k, alpha, ai, lda, b, ldb, beta, ci, ldc)
        }
    }
}
