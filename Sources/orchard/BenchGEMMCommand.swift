import ArgumentParser
import Foundation
import OrchardBenchmarks
import OrchardSupport
import OrchardML

/// `orchard bench gemm`: GFLOP/s of one matrix-multiply shape on every available backend.
struct BenchGEMM: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gemm",
        abstract: "Time C = op(A)·op(B) for one shape on every available backend; print GFLOP/s as one JSON line.",
        discussion: """
            Operands are seeded uniform values; each backend runs the product repeatedly for about --seconds, and the \
            best of --repeats such runs is reported. 'automatic' is the backend the engine picks for the shape.
            """
    )

    @Option(parsing: .unconditional, help: "Rows of op(A) and C.")
    var m: Int = 10

    @Option(parsing: .unconditional, help: "Columns of op(B) and C.")
    var n: Int = 200

    @Option(parsing: .unconditional, help: "Depth: columns of op(A), rows of op(B).")
    var k: Int = 784

    @Flag(help: "Use Aᵀ (A stored k × m).")
    var transposeA = false

    @Flag(help: "Use Bᵀ (B stored n × k), as a dense layer's forward pass does.")
    var transposeB = false

    @Option(parsing: .unconditional, help: "Threads a multiply may use.")
    var threads: Int = 1

    @Option(parsing: .unconditional, help: "Timed runs per backend; the best is reported.")
    var repeats: Int = 5

    @Option(parsing: .unconditional, help: "Approximate seconds per timed run.")
    var seconds: Double = 0.2

    func validate() throws {
        guard m > 0, n > 0, k > 0, threads > 0, repeats > 0, seconds > 0 else {
            throw ValidationError("--m, --n, --k, --threads, --repeats and --seconds must be positive")
        }
    }

    func run() async throws {
        GEMM.setThreads(threads)
        var random = OrchardRandom(seed: 1)
        let a = (0..<(m * k)).map { _ in random.nextFloat() - 0.5 }
        let b = (0..<(k * n)).map { _ in random.nextFloat() - 0.5 }
        var c = [Float](repeating: 0, count: m * n)
        let lda = transposeA ? m : k, ldb = transposeB ? k : n
        var backends: [MatrixBackend] = [.automatic, .portable]
        if GEMM.isAVX2Available { backends.append(.avx2) }
        if GEMM.isAVX512Available { backends.append(.avx512) }
        if GEMM.isBLASAvailable { backends.append(.blas) }

        let flops = 2.0 * Double(m) * Double(n) * Double(k)
        let iterations = max(1, Int(seconds * 20e9 / flops))
        let clock = ContinuousClock()
        var gflops: [String: Double] = [:]
        // Progress on standard error; standard output is the one JSON line.
        let progress = ProgressReporter("bench gemm", total: backends.count * repeats, unit: "runs")
        for (index, backend) in backends.enumerated() {
            var best = Double.infinity
            for run in 0..<repeats {
                let start = clock.now
                a.withUnsafeBufferPointer { pa in
                    b.withUnsafeBufferPointer { pb in
                        c.withUnsafeMutableBufferPointer { pc in
                            for _ in 0..<iterations {
                                GEMM.multiply(
                                    transposeA: transposeA, transposeB: transposeB, m: m, n: n, k: k,
                                    a: pa.baseAddress!, lda: lda, b: pb.baseAddress!, ldb: ldb,
                                    c: pc.baseAddress!, ldc: n, using: backend
                                )
                            }
                        }
                    }
                }
                let elapsed = clock.now - start
                best = min(best, elapsed.inSeconds)
                progress.update(index * repeats + run + 1, detail: backend.description)
            }
            gflops[backend.description] = (flops * Double(iterations) / best / 1e8).rounded() / 10
        }
        try JSONLine.write(
            Result(
                m: m, n: n, k: k, transposeA: transposeA, transposeB: transposeB, threads: threads, gflops: gflops,
                automaticRunsOn: GEMM.backend(transposeA: transposeA, transposeB: transposeB, m: m, n: n, k: k).description,
                blasCore: GEMM.blasCore
            ))
    }

    /// The JSON line `orchard bench gemm` prints: GFLOP/s by backend name.
    struct Result: Encodable {
        var m: Int
        var n: Int
        var k: Int
        var transposeA: Bool
        var transposeB: Bool
        var threads: Int
        var gflops: [String: Double]
        var automaticRunsOn: String
        /// The kernels the loaded OpenBLAS runs; absent without OpenBLAS.
        var blasCore: String?
        var engine = "orchard"
    }
}
