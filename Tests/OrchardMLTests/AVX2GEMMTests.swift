import Foundation
import OrchardSupport
import OrchardTesting
@testable import OrchardML
import Testing

/// The AVX2 kernels and the portable kernel they stand in for, over every tile shape and edge of the kernels:
/// `A · Bᵀ` row tiles of 1…5 rows and 1…2 columns, depths with and without a vector tail and with several depth
/// slices; `op(A) · B` row tiles of 1…6 rows, column strips of 16, 9…15 and 1…8; alpha and beta; padding.
@Suite struct AVX2GEMMTests {
    struct Shape: Sendable, CustomTestStringConvertible {
        var m: Int, n: Int, k: Int, ta: Bool, tb: Bool
        var testDescription: String { "\(m)x\(n)x\(k) tA=\(ta) tB=\(tb)" }
    }

    /// Every shape class of both kernels.
    static let shapes: [Shape] = {
        var s: [Shape] = []
        // A · Bᵀ: rows 1…11 cover every row tile (5, then 1…4), odd columns a one-column tile, depths a tail
        // (k % 8 ≠ 0), a vector-only depth, k = 1, and several depth slices (k > 256).
        for m in [1, 2, 3, 4, 5, 6, 9, 11] {
            for (n, k) in [(1, 1), (3, 7), (10, 8), (7, 200), (5, 257), (4, 784), (3, 1031)] {
                s.append(Shape(m: m, n: n, k: k, ta: false, tb: true))
            }
        }
        // op(A) · B: rows 1…13 cover every row tile (6, then 1…5), columns every strip width, depths 1 and more.
        for ta in [false, true] {
            for m in [1, 2, 3, 4, 5, 6, 7, 13] {
                for (n, k) in [(1, 1), (5, 3), (8, 10), (9, 2), (15, 17), (16, 1), (33, 9), (200, 10)] {
                    s.append(Shape(m: m, n: n, k: k, ta: ta, tb: false))
                }
            }
        }
        // The 2NN's training and evaluation shapes.
        s.append(Shape(m: 10, n: 200, k: 784, ta: false, tb: true))
        s.append(Shape(m: 200, n: 784, k: 10, ta: true, tb: false))
        s.append(Shape(m: 10, n: 784, k: 200, ta: false, tb: false))
        s.append(Shape(m: 130, n: 10, k: 200, ta: false, tb: true))
        return s
    }()

    static let scalings: [(alpha: Float, beta: Float)] = [(1, 0), (0.5, 1), (-1.5, 0.25)]

    /// Runs a product on `backend` for each scaling with padded strides and checks it against the reference;
    /// padding must stay untouched and, with beta 0, C's old contents (NaN here) must never be read.
    static func check(_ t: Shape, backend: MatrixBackend, threads: Int) {
        var rng = SplitMix64(state: UInt64(t.m * 1_000_003 + t.n * 1009 + t.k * 7 + (t.ta ? 1 : 0)))
        for (alpha, beta) in scalings {
            let pad = 3
            let rowsA = t.ta ? t.k : t.m, colsA = t.ta ? t.m : t.k
            let rowsB = t.tb ? t.n : t.k, colsB = t.tb ? t.k : t.n
            let lda = colsA + pad, ldb = colsB + pad, ldc = t.n + pad
            let a = (0..<(rowsA * lda)).map { _ in rng.nextFloat() }
            let b = (0..<(rowsB * ldb)).map { _ in rng.nextFloat() }
            let c0 = (0..<(t.m * ldc)).map { index in beta == 0 && index % ldc < t.n ? Float.nan : rng.nextFloat() }
            let expected = GEMMTests.reference(
                transposeA: t.ta, transposeB: t.tb, m: t.m, n: t.n, k: t.k, alpha: alpha,
                a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c0.map { $0.isNaN ? 0 : $0 }, ldc: ldc)
            var c = c0
            a.withUnsafeBufferPointer { pa in
                b.withUnsafeBufferPointer { pb in
                    c.withUnsafeMutableBufferPointer { pc in
                        if backend == .avx2 || backend == .avx512 {
                            AVX2GEMM.multiply(
                                transposeA: t.ta, transposeB: t.tb, m: t.m, n: t.n, k: t.k, alpha: alpha,
                                a: pa.baseAddress!, lda: lda, b: pb.baseAddress!, ldb: ldb, beta: beta,
                                c: pc.baseAddress!, ldc: ldc, threads: threads, wide: backend == .avx512)
                        } else {
                            PortableGEMM.multiply(
                                transposeA: t.ta, transposeB: t.tb, m: t.m, n: t.n, k: t.k, alpha: alpha,
                                a: pa.baseAddress!, lda: lda, b: pb.baseAddress!, ldb: ldb, beta: beta,
                                c: pc.baseAddress!, ldc: ldc, threads: threads)
                        }
                    }
                }
            }
            var worst: Float = 0
            for i in 0..<t.m {
                for j in 0..<t.n {
                    let e = expected[i * ldc + j]
                    worst = max(worst, c[i * ldc + j].isNaN ? .infinity : abs(c[i * ldc + j] - e) / max(1, abs(e)))
                }
                for j in t.n..<ldc { #expect(c[i * ldc + j] == c0[i * ldc + j], "padding of row \(i) was written") }
            }
            #expect(worst < 1e-4, "\(backend) α=\(alpha) β=\(beta): relative error \(worst)")
        }
    }

    @Test(.enabled(if: AVX2GEMM.isAvailable), arguments: shapes)
    func avx2MatchesReference(_ t: Shape) {
        Self.check(t, backend: .avx2, threads: 1)
    }

    /// The AVX-512 kernels over the same shapes (their tiles are 10 × 2 and 8 rows × 32 columns: the shapes cover
    /// every row count and a masked tail in each); skipped on a CPU without AVX-512F, where they are never chosen.
    /// Tolerance as for AVX2 (``check(_:backend:threads:)``).
    @Test(.enabled(if: AVX2GEMM.isAVX512Available, "the CPU has no AVX-512F"), arguments: shapes + wideShapes)
    func avx512MatchesReference(_ t: Shape) {
        Self.check(t, backend: .avx512, threads: 1)
    }

    /// Shapes for the AVX-512 tiles' edges: row tiles of 7…10 and a second panel after 10 rows, strips of 17…32
    /// columns, depths with a 16-lane tail.
    static let wideShapes: [Shape] = {
        var s: [Shape] = []
        for m in [7, 8, 15, 17] {
            for (n, k) in [(17, 3), (31, 5), (32, 1), (47, 16), (64, 33)] {
                s.append(Shape(m: m, n: n, k: k, ta: false, tb: false))
                s.append(Shape(m: m, n: n, k: k, ta: true, tb: false))
            }
        }
        for m in [7, 8, 10, 15, 17, 20, 21] {
            for (n, k) in [(3, 15), (2, 16), (5, 17), (4, 1025), (9, 200)] { s.append(Shape(m: m, n: n, k: k, ta: false, tb: true)) }
        }
        return s
    }()

    @Test(
        .enabled(if: AVX2GEMM.isAVX512Available, "the CPU has no AVX-512F"),
        arguments: [Shape(m: 1000, n: 200, k: 100, ta: false, tb: true), Shape(m: 200, n: 40, k: 10, ta: true, tb: false)])
    func avx512SplitsRowsBetweenThreads(_ t: Shape) {
        Self.check(t, backend: .avx512, threads: 2)
    }

    @Test(arguments: shapes)
    func portableMatchesReference(_ t: Shape) {
        Self.check(t, backend: .portable, threads: 1)
    }

    /// Rows split between threads give the same products.
    @Test(
        .enabled(if: AVX2GEMM.isAvailable),
        arguments: [
            Shape(m: 1000, n: 200, k: 100, ta: false, tb: true), Shape(m: 200, n: 40, k: 10, ta: true, tb: false),
            Shape(m: 131, n: 17, k: 9, ta: false, tb: false),
        ])
    func avx2SplitsRowsBetweenThreads(_ t: Shape) {
        Self.check(t, backend: .avx2, threads: 2)
    }

    /// With k = 0 or alpha = 0 the product is `beta · C`.
    @Test(.enabled(if: AVX2GEMM.isAvailable), arguments: [false, true])
    func emptyDepthScalesC(_ transposeB: Bool) {
        let a: [Float] = [1, 2, 3, 4], b: [Float] = [5, 6, 7, 8]
        for (k, alpha) in [(0, Float(1)), (2, Float(0))] {
            var c: [Float] = [1, 2, 3, 4]
            AVX2GEMM.multiply(
                transposeA: false, transposeB: transposeB, m: 2, n: 2, k: k, alpha: alpha,
                a: a, lda: 2, b: b, ldb: 2, beta: 0.5, c: &c, ldc: 2, threads: 1)
            #expect(c == [0.5, 1, 1.5, 2])
        }
    }

    /// The automatic backend sends thin products (short batch, narrow output or shallow depth), weight gradients of short batches and
    /// long-batch input gradients to the AVX2 kernels; forward products at batch 64 and more, deeper weight gradients,
    /// short untransposed A and large products to BLAS when it is there; never a doubly transposed one to AVX2.
    @Test func automaticRouting() {
        let avx2Shapes: [(Bool, Bool, Int, Int, Int)] = [
            (false, true, 10, 200, 784),  // batch-10 forward
            (true, false, 200, 784, 10),  // batch-10 weight gradient
            (false, false, 10, 200, 200),  // batch-10 input gradient
            (true, false, 200, 784, 64),  // batch-64 weight gradient
            (true, false, 200, 200, 64),
            (true, false, 200, 784, 128),  // a weight gradient of one half of a batch-256 step
            (true, false, 200, 200, 128),
            (false, false, 256, 200, 200),  // batch-256 input gradient
            (false, true, 256, 10, 200),  // batch-256 output layer
        ]
        let blasShapes: [(Bool, Bool, Int, Int, Int)] = [
            (false, true, 256, 200, 784),  // batch-256 forward
            (false, true, 64, 200, 784),  // batch-64 forward
            (false, true, 1000, 200, 784),  // an evaluation batch's forward
            (true, false, 200, 784, 256),  // batch-256 weight gradient
            (true, false, 200, 784, 192),
            (false, false, 64, 200, 200),  // a short untransposed A
            (false, false, 512, 512, 512),  // large
        ]
        let toAVX2 = avx2Shapes.map { GEMM.resolve(.automatic, transposeA: $0.0, transposeB: $0.1, m: $0.2, n: $0.3, k: $0.4) }
        let toBLAS = blasShapes.map { GEMM.resolve(.automatic, transposeA: $0.0, transposeB: $0.1, m: $0.2, n: $0.3, k: $0.4) }
        let both = GEMM.resolve(.automatic, transposeA: true, transposeB: true, m: 10, n: 10, k: 10)
        // Orchard's own kernels: on AVX-512 when the CPU has it, else AVX2; `.avx2` still forces AVX2.
        func own(_ shape: (Bool, Bool, Int, Int, Int)) -> MatrixBackend { AVX2GEMM.isAVX512Available ? .avx512 : .avx2 }
        if AVX2GEMM.isAvailable {
            #expect(zip(toAVX2, avx2Shapes).allSatisfy { $0 == own($1) })
            // With AVX-512, weight gradients up to a batch of 256 run on it rather than on BLAS.
            #expect(
                zip(toBLAS, blasShapes).allSatisfy { resolved, shape in
                    AVX2GEMM.isAVX512Available && shape.0 && shape.4 <= 256 ? resolved == .avx512 : resolved == (GEMM.usesBLAS ? .blas : own(shape))
                })
            #expect(GEMM.resolve(.avx2, transposeA: false, transposeB: true, m: 10, n: 200, k: 784) == .avx2)
        } else {
            #expect(!(toAVX2 + toBLAS).contains(.avx2) && !(toAVX2 + toBLAS).contains(.avx512))
        }
        #expect(GEMM.resolve(.avx512, transposeA: false, transposeB: true, m: 10, n: 200, k: 784) == (AVX2GEMM.isAVX512Available ? .avx512 : .portable))
        #expect(both != .avx2 && both != .avx512)
        #expect(GEMM.resolve(.portable, transposeA: false, transposeB: true, m: 10, n: 200, k: 784) == .portable)
    }
}

/// The system BLAS under ``MatrixBackend/automatic``: OpenBLAS takes its SSE3 kernels (Prescott) for a CPU model it does
/// not know, slower than Orchard's AVX2 ones, so such a core is left alone, and on a CPU with AVX-512 OpenBLAS is loaded
/// with its SkylakeX kernels unless `OPENBLAS_CORETYPE` names a core. Checked in `orchard bench gemm` child processes,
/// each loading OpenBLAS afresh.
@Suite struct BLASCoreTests {
    @Test func narrowCoresAreNamedAndOnlyNarrowerThanAVX2OnACPUWithAVX2() {
        for core in ["Prescott", "Core2", "Nehalem", "Sandybridge", "Bulldozer", "Unknown"] {
            #expect(BLASLibrary.isNarrower(core: core, thanAVX2: true), "\(core)")
            #expect(!BLASLibrary.isNarrower(core: core, thanAVX2: false), "\(core) on a CPU without AVX2")
        }
        for core in ["Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"] {
            #expect(!BLASLibrary.isNarrower(core: core, thanAVX2: true), "\(core)")
        }
        #expect(!BLASLibrary.isNarrower(core: nil, thanAVX2: true), "a BLAS that names no core is taken at its word")
    }

    /// Whether this process loaded an OpenBLAS for x86-64 built with every core's kernels, which takes
    /// `OPENBLAS_CORETYPE` (Debian's; CI's): the one these tests are about. Elsewhere (another BLAS, none, an OpenBLAS
    /// built for one core, arm64, `ORCHARD_BLAS=off`) they do not apply.
    static var steerableOpenBLAS: Bool {
        #if os(Linux) && arch(x86_64)
        BLASLibrary.shared?.isDynamicArch == true
        #else
        false
        #endif
    }

    @Test(
        .enabled(if: steerableOpenBLAS && AVX2GEMM.hasSkylakeAVX512Subsets, "OPENBLAS_CORETYPE is set only for an x86-64 OpenBLAS on a CPU with AVX-512")
    )
    func loadingOpenBLASLeavesTheEnvironmentAsItFoundIt() throws {
        // The environment this process started with (/proc/self/environ) against the one it has once BLAS is loaded.
        let initial = try Data(contentsOf: URL(fileURLWithPath: "/proc/self/environ")).split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        let started = initial.first { $0.hasPrefix("OPENBLAS_CORETYPE=") }.map { String($0.dropFirst("OPENBLAS_CORETYPE=".count)) }
        _ = GEMM.blasCore
        #expect(getenv("OPENBLAS_CORETYPE").map { String(cString: $0) } == started)
    }

    private func benchGEMM(coreType: String?) async throws -> [String: Any] {
        let run = try await OrchardExecutable.run(
            ["bench", "gemm", "--m", "128", "--n", "200", "--k", "784", "--transpose-b", "--repeats", "1", "--seconds", "0.0001"],
            environment: ["OPENBLAS_CORETYPE": coreType, "ORCHARD_BLAS": nil])
        #expect(run.status == 0, "\(run.error)")
        return try #require(try JSONSerialization.jsonObject(with: Data(run.output.utf8)) as? [String: Any], "\(run.output)")
    }

    @Test(.enabled(if: steerableOpenBLAS, "needs an x86-64 OpenBLAS built with every core's kernels"))
    func aCoreTheUserNamesIsKeptAndANarrowOneIsLeftToOrchardsKernels() async throws {
        let line = try await benchGEMM(coreType: "Prescott")
        #expect(line["blas_core"] as? String == "Prescott")
        #expect(line["automatic_runs_on"] as? String == (GEMM.isAVX2Available ? Self.ownKernels : "blas"))
    }

    @Test(.enabled(if: steerableOpenBLAS, "needs an x86-64 OpenBLAS built with every core's kernels"))
    func onACPUWithAVX512OpenBLASRunsItsSkylakeXKernels() async throws {
        let line = try await benchGEMM(coreType: nil)
        let core = try #require(line["blas_core"] as? String)
        if AVX2GEMM.hasSkylakeAVX512Subsets { #expect(core == "SkylakeX") }
        #expect(line["automatic_runs_on"] as? String == (BLASLibrary.isNarrower(core: core, thanAVX2: GEMM.isAVX2Available) ? Self.ownKernels : "blas"))
    }

    /// Where the automatic backend runs a product it keeps from the BLAS: Orchard's widest kernels.
    static var ownKernels: String { AVX2GEMM.isAVX512Available ? "avx512" : "avx2" }
}
