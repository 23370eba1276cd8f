import OrchardSupport
@testable import OrchardML
import Testing

@Suite struct GEMMTests {
    /// Straightforward triple loop in Double, the reference every backend is checked against.
    static func reference(
        transposeA: Bool, transposeB: Bool, m: Int, n: Int, k: Int, alpha: Float,
        a: [Float], lda: Int, b: [Float], ldb: Int, beta: Float, c: [Float], ldc: Int
    ) -> [Float] {
        var out = c
        for i in 0..<m {
            for j in 0..<n {
                var sum = 0.0
                for p in 0..<k {
                    let av = transposeA ? a[p * lda + i] : a[i * lda + p]
                    let bv = transposeB ? b[j * ldb + p] : b[p * ldb + j]
                    sum += Double(av) * Double(bv)
                }
                out[i * ldc + j] = Float(Double(alpha) * sum + Double(beta) * Double(c[i * ldc + j]))
            }
        }
        return out
    }

    static var backends: [MatrixBackend] {
        [.portable, .automatic] + (GEMM.isAVX2Available ? [.avx2] : []) + (GEMM.isAVX512Available ? [.avx512] : []) + (GEMM.isBLASAvailable ? [.blas] : [])
    }

    struct Case: Sendable, CustomTestStringConvertible {
        var m: Int, n: Int, k: Int, ta: Bool, tb: Bool, alpha: Float, beta: Float, pad: Int
        var testDescription: String { "\(m)x\(n)x\(k) tA=\(ta) tB=\(tb) α=\(alpha) β=\(beta) pad=\(pad)" }
    }

    static let cases: [Case] = [
        Case(m: 1, n: 1, k: 1, ta: false, tb: false, alpha: 1, beta: 0, pad: 0),
        Case(m: 6, n: 16, k: 5, ta: false, tb: false, alpha: 1, beta: 0, pad: 0),
        Case(m: 7, n: 17, k: 300, ta: false, tb: false, alpha: 1, beta: 0, pad: 3),
        Case(m: 10, n: 200, k: 784, ta: false, tb: true, alpha: 1, beta: 0, pad: 0),
        Case(m: 200, n: 784, k: 10, ta: true, tb: false, alpha: 0.5, beta: 1, pad: 0),
        Case(m: 73, n: 31, k: 257, ta: true, tb: true, alpha: -1.5, beta: 0.25, pad: 2),
        Case(m: 150, n: 2100, k: 9, ta: false, tb: false, alpha: 1, beta: 2, pad: 1),
        Case(m: 5, n: 3, k: 0, ta: false, tb: false, alpha: 1, beta: 0.5, pad: 0),
        Case(m: 12, n: 25, k: 9, ta: true, tb: false, alpha: 2, beta: 0, pad: 1),
        Case(m: 20, n: 40, k: 33, ta: true, tb: true, alpha: 1, beta: 1, pad: 0),
        Case(m: 3, n: 9, k: 13, ta: false, tb: true, alpha: 1, beta: 0, pad: 2),
    ]

    @Test(arguments: cases, [1, 2])
    func matchesReference(_ t: Case, threads: Int) {
        var rng = SplitMix64(state: UInt64(t.m * 1_000_003 + t.n * 1009 + t.k))
        let rowsA = t.ta ? t.k : t.m, colsA = t.ta ? t.m : t.k
        let rowsB = t.tb ? t.n : t.k, colsB = t.tb ? t.k : t.n
        let lda = colsA + t.pad, ldb = colsB + t.pad, ldc = t.n + t.pad
        let a = (0..<(rowsA * lda)).map { _ in rng.nextFloat() }
        let b = (0..<(rowsB * ldb)).map { _ in rng.nextFloat() }
        let c0 = (0..<(t.m * ldc)).map { _ in rng.nextFloat() }
        let expected = Self.reference(
            transposeA: t.ta, transposeB: t.tb, m: t.m, n: t.n, k: t.k, alpha: t.alpha,
            a: a, lda: lda, b: b, ldb: ldb, beta: t.beta, c: c0, ldc: ldc)
        for backend in Self.backends {
            var c = c0
            GEMMTestSupport.run(t, a: a, lda: lda, b: b, ldb: ldb, c: &c, ldc: ldc, backend: backend, threads: threads)
            var worst: Float = 0
            for i in 0..<t.m {
                for j in 0..<t.n {
                    let e = expected[i * ldc + j]
                    worst = max(worst, abs(c[i * ldc + j] - e) / max(1, abs(e)))
                }
                // Padding columns are never written.
                for j in t.n..<ldc { #expect(c[i * ldc + j] == c0[i * ldc + j]) }
            }
            #expect(worst < 1e-4, "backend \(backend): relative error \(worst)")
        }
    }
}

enum GEMMTestSupport {
    static func run(
        _ t: GEMMTests.Case, a: [Float], lda: Int, b: [Float], ldb: Int, c: inout [Float], ldc: Int,
        backend: MatrixBackend, threads: Int
    ) {
        // The portable kernel is called directly so that the thread count is explicit: tests run in
        // parallel, and the process-wide setting must not change under other tests.
        a.withUnsafeBufferPointer { pa in
            b.withUnsafeBufferPointer { pb in
                c.withUnsafeMutableBufferPointer { pc in
                    if backend == .portable {
                        PortableGEMM.multiply(
                            transposeA: t.ta, transposeB: t.tb, m: t.m, n: t.n, k: t.k, alpha: t.alpha,
                            a: pa.baseAddress!, lda: lda, b: pb.baseAddress!, ldb: ldb, beta: t.beta,
                            c: pc.baseAddress!, ldc: ldc, threads: threads)
                    } else {
                        GEMM.multiply(
                            transposeA: t.ta, transposeB: t.tb, m: t.m, n: t.n, k: t.k, alpha: t.alpha,
                            a: pa.baseAddress!, lda: lda, b: pb.baseAddress!, ldb: ldb, beta: t.beta,
                            c: pc.baseAddress!, ldc: ldc, using: backend)
                    }
                }
            }
        }
    }
}

extension SplitMix64 {
    /// A value in [-1, 1) for test inputs.
    mutating func nextFloat() -> Float { Float(next() >> 40) / Float(1 << 24) * 2 - 1 }
}
