#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization

/// Which implementation runs matrix multiplies.
public struct MatrixBackend: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable { case automatic, portable, avx2, avx512, blas }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Per product, the fastest available one (see ``GEMM/backend(transposeA:transposeB:m:n:k:)``): the AVX2
    /// kernels for thin products (the training and inference shapes of dense layers), the system BLAS for large
    /// square-ish ones, the portable kernel when neither is available.
    public static let automatic = MatrixBackend(.automatic)
    /// Orchard's own blocked SIMD kernel in Swift, built for the baseline instruction set; always available.
    public static let portable = MatrixBackend(.portable)
    /// Orchard's own kernels for x86-64 CPUs with AVX2 and FMA (C, compiled per function for those
    /// instructions and chosen at run time). Products with both operands transposed run on the portable kernel.
    public static let avx2 = MatrixBackend(.avx2)
    /// The same kernels on AVX-512F's 16-wide vectors, for x86-64 CPUs that have it (chosen at run time; the AVX2 ones
    /// stay for every other x86-64 CPU). Products with both operands transposed run on the portable kernel.
    public static let avx512 = MatrixBackend(.avx512)
    /// The system BLAS (OpenBLAS on Linux, Accelerate on Apple), loaded at run time when present.
    public static let blas = MatrixBackend(.blas)

    public var description: String { kind.rawValue }
}

/// Single-precision general matrix multiply, row-major: `C = alpha · op(A) · op(B) + beta · C`.
///
/// By default (``MatrixBackend/automatic``) each product runs where it is fastest: thin products — at most 32
/// rows, a depth of at most 32 (rank-k updates such as a weight gradient), or `A · Bᵀ` with at most 256 columns
/// (a dense layer's forward pass at any batch size) — on Orchard's AVX2 kernels when the CPU has AVX2 and FMA (the
/// `op(A) · B` ones on their AVX-512 versions when it has AVX-512F);
/// other products on the system BLAS when it can be loaded (nothing is linked at build time, so a machine
/// without it still builds and runs) and its kernels are not narrower than the AVX2 ones (an OpenBLAS that fell back to
/// SSE kernels for a CPU it does not know), otherwise on the AVX2 kernels, otherwise on the portable kernel. On a CPU
/// with AVX-512, OpenBLAS is loaded with its SkylakeX kernels unless `OPENBLAS_CORETYPE` names others.
/// `ORCHARD_BLAS=off` keeps the BLAS from being loaded at all. ``GEMM/setBackend(_:)`` pins one backend, and
/// ``GEMM/backend(transposeA:transposeB:m:n:k:)`` tells which one a product runs on.
public enum GEMM {
    private struct Settings: Sendable {
        var backend: MatrixBackend
        var threads: Int
    }

    private static let settings: Mutex<Settings> = Mutex(Settings(backend: .automatic, threads: 1))

    /// The configured backend (``MatrixBackend/automatic`` unless ``setBackend(_:)`` pinned one).
    public static var backend: MatrixBackend { settings.withLock { $0.backend } }

    /// Whether a system BLAS was found and loaded.
    public static var isBLASAvailable: Bool { BLASLibrary.shared != nil }

    /// The kernels the loaded OpenBLAS runs (its core name, e.g. "SkylakeX" or "Haswell"); nil without OpenBLAS.
    public static var blasCore: String? { BLASLibrary.shared?.core }

    /// Whether ``MatrixBackend/automatic`` sends products to the system BLAS: it is loaded, and its kernels are not
    /// narrower than the AVX2 ones.
    static var usesBLAS: Bool { BLASLibrary.shared.map { !$0.isNarrowerThanOwnKernels } ?? false }

    /// Whether the CPU can run the AVX2 kernels.
    public static var isAVX2Available: Bool { AVX2GEMM.isAvailable }

    /// Whether the CPU can run the AVX-512 kernels.
    public static var isAVX512Available: Bool { AVX2GEMM.isAVX512Available }

    /// Number of threads a multiply may use.
    public static var threads: Int { settings.withLock { $0.threads } }

    /// Selects the backend; selecting `.blas` or `.avx2` when it is not available is an error.
    public static func setBackend(_ backend: MatrixBackend) throws(EngineError) {
        if backend == .blas && BLASLibrary.shared == nil {
            throw EngineError(
                .unavailable, "no system BLAS could be loaded (looked for \(BLASLibrary.candidates.joined(separator: ", ")); ORCHARD_BLAS=off also disables it)"
            )
        }
        if backend == .avx2 && !AVX2GEMM.isAvailable {
            throw EngineError(.unavailable, "the AVX2 kernels need an x86-64 CPU with AVX2 and FMA")
        }
        if backend == .avx512 && !AVX2GEMM.isAVX512Available {
            throw EngineError(.unavailable, "the AVX-512 kernels need an x86-64 CPU with AVX-512F, AVX2 and FMA")
        }
        settings.withLock { $0.backend = backend }
    }

    /// Sets how many threads a multiply may use (at least 1).
    public static func setThreads(_ count: Int) {
        let n = max(1, count)
        settings.withLock { $0.threads = n }
        BLASLibrary.shared?.setThreads(n)
    }

    /// The backend a product of this shape runs on under the configured backend.
    public static func backend(transposeA: Bool = false, transposeB: Bool = false, m: Int, n: Int, k: Int) -> MatrixBackend {
        resolve(backend, transposeA: transposeA, transposeB: transposeB, m: m, n: n, k: k)
    }

    /// The concrete backend `chosen` means for a product of this shape.
    static func resolve(_ chosen: MatrixBackend, transposeA: Bool, transposeB: Bool, m: Int, n: Int, k: Int) -> MatrixBackend {
        let avx2 = AVX2GEMM.isAvailable && !(transposeA && transposeB)
        // Orchard's own kernels on AVX-512 where the CPU has it. op(A) · B: one thread on the development VM's AMD EPYC,
        // 112 against 86 GFLOP/s at 200 × 784 × 256 with Aᵀ, 94 against 84 at depth 10, 111 against 102 at depth 128.
        // A · Bᵀ with 10-row tiles (a batch of 10 sweeps the weights once): one thread on an Intel Xeon with AVX-512,
        // 74–81 against 63–71 at 10 × 200 × 784, a tie at 10 × 200 × 200. Best of five or seven, same run.
        let wide = AVX2GEMM.isAVX512Available
        let own: MatrixBackend = wide ? .avx512 : .avx2
        switch chosen {
        case .blas: return BLASLibrary.shared != nil ? .blas : .portable
        case .avx2: return avx2 ? .avx2 : .portable
        case .avx512: return avx2 && AVX2GEMM.isAVX512Available ? .avx512 : .portable
        case .portable: return .portable
        default:
            // Thin products (a short batch, a depth or a width of at most 32: a batch-10 step, a 10-class output layer)
            // run on the AVX2 kernels, which need no packing: on two cores of the development VM 36–52 GFLOP/s against
            // 25–29 for OpenBLAS at the 2NN's batch-10 shapes and its batch-256 output layer (256 × 10 × 200).
            let thin = m <= 32 || n <= 32 || k <= 32
            // So do weight gradients of a batch of at most 128 (Aᵀ·B with a depth ≤ 128: 141 against 117 GFLOP/s at
            // 200 × 784 × 64, 94 against 54 at 200 × 200 × 64; at depth 128, a batch-256 step cut in two parts, one
            // thread each: 84 against 81 at 200 × 784 × 128 and 93 against 81 at 200 × 200 × 128, two threads 157
            // against 140 and 144 against 129) and a hidden layer's input gradient at a long batch (A·B with more
            // than 64 rows: 151 against 147 at 256 × 200 × 200). Everything else goes to BLAS, which packs its
            // operands: the forward products A·Bᵀ at batch 64 and 256 (122 against 95 at 256 × 200 × 784) and the
            // deeper weight gradients (127 against 103 at 200 × 784 × 256; 85 against 70 at depth 192, one thread).
            // Best of five, same run.
            // With AVX-512, weight gradients up to a depth of 256 too (112 against 104 for BLAS at 200 × 784 × 256).
            let small =
                m * n * k <= 1 << 26 && min(m, n, k) <= 256
                && ((transposeA && k <= (wide ? 256 : 128)) || (!transposeA && !transposeB && m > 64))
            if avx2 && (thin || small) { return own }
            if usesBLAS { return .blas }
            return avx2 ? own : .portable
        }
    }

    /// Computes `C = alpha · op(A) · op(B) + beta · C` for row-major matrices.
    /// - Parameters:
    ///   - transposeA: Use Aᵀ; A is then stored `k × m`.
    ///   - transposeB: Use Bᵀ; B is then stored `n × k`.
    ///   - m: Rows of op(A) and C.
    ///   - n: Columns of op(B) and C.
    ///   - k: Columns of op(A), rows of op(B).
    ///   - alpha: The scale of op(A) · op(B).
    ///   - a: A, row-major.
    ///   - lda: Row stride of A as stored.
    ///   - b: B, row-major.
    ///   - ldb: Row stride of B as stored.
    ///   - beta: The scale of C's current contents.
    ///   - c: C, row-major; receives the result.
    ///   - ldc: Row stride of C.
    ///   - chosen: Run on this backend instead of the configured one (an unavailable one falls back as
    ///     `resolve(_:transposeA:transposeB:m:n:k:)` says: `.blas` and `.avx2` to `.portable`).
    public static func multiply(
        transposeA: Bool = false, transposeB: Bool = false,
        m: Int, n: Int, k: Int, alpha: Float = 1,
        a: UnsafePointer<Float>, lda: Int,
        b: UnsafePointer<Float>, ldb: Int,
        beta: Float = 0,
        c: UnsafeMutablePointer<Float>, ldc: Int,
        using chosen: MatrixBackend? = nil
    ) {
        guard m > 0, n > 0 else { return }
        let (current, threads) = settings.withLock { ($0.backend, $0.threads) }
        let resolved = resolve(chosen ?? current, transposeA: transposeA, transposeB: transposeB, m: m, n: n, k: k)
        switch resolved {
        case .blas:
            BLASLibrary.shared!.sgemm(transposeA, transposeB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
        case .avx2, .avx512:
            AVX2GEMM.multiply(
                transposeA: transposeA, transposeB: transposeB, m: m, n: n, k: k, alpha: alpha,
                a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc, threads: threads, wide: resolved == .avx512
            )
        default:
            PortableGEMM.multiply(
                transposeA: transposeA, transposeB: transposeB, m: m, n: n, k: k, alpha: alpha,
                a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc, threads: threads
            )
        }
    }
}

/// The system BLAS, opened with `dlopen` so that nothing is linked at build time.
final class BLASLibrary: Sendable {
    typealias SgemmFunction =
        @convention(c) (
            Int32, Int32, Int32, Int32, Int32, Int32, Float,
            UnsafePointer<Float>?, Int32, UnsafePointer<Float>?, Int32, Float, UnsafeMutablePointer<Float>?, Int32
        ) -> Void
    typealias SetThreadsFunction = @convention(c) (Int32) -> Void

    static let candidates: [String] = {
        #if canImport(Darwin)
        ["/System/Library/Frameworks/Accelerate.framework/Accelerate"]
        #else
        ["libopenblas.so.0", "libopenblas.so", "libopenblasp.so.0", "libblas.so.3"]
        #endif
    }()

    /// OpenBLAS's cores whose sgemm kernels are narrower than Orchard's AVX2 ones (SSE, or AVX without FMA): the
    /// names `openblas_get_corename` returns for them.
    static let narrowCores: Set<String> = [
        "prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "athlon", "opteron", "opteron_sse3", "barcelona",
        "bobcat", "nano", "sandybridge", "bulldozer", "piledriver", "steamroller", "katmai", "coppermine", "northwood",
        "banias", "unknown",
    ]

    static let shared: BLASLibrary? = {
        if let setting = getenv("ORCHARD_BLAS").map({ String(cString: $0) }), ["off", "0", "no", "false"].contains(setting.lowercased()) {
            return nil
        }
        // OpenBLAS picks its kernels from the CPU model when it loads and takes its oldest ones (Prescott's SSE3) for a
        // model it does not know: Debian's 0.3.21 on a 2-core Xeon of model 207 ran a 128 × 200 × 784 product at 26
        // GFLOP/s, and at 114 with its SkylakeX kernels. So on a CPU with the AVX-512 subsets those kernels need, and
        // unless the user chose a core (OPENBLAS_CORETYPE), it is loaded with that core named, and the variable is
        // removed again once it has loaded. (`setenv` is not safe against another thread's `getenv` at that moment; this
        // runs once, at the first product or `GEMM` query, and OpenBLAS offers no other way to choose its kernels.)
        let steer = getenv("OPENBLAS_CORETYPE") == nil && AVX2GEMM.hasSkylakeAVX512Subsets
        if steer { setenv("OPENBLAS_CORETYPE", "SkylakeX", 0) }
        defer { if steer { unsetenv("OPENBLAS_CORETYPE") } }
        for name in candidates {
            guard let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) else { continue }
            guard let symbol = dlsym(handle, "cblas_sgemm") else {
                dlclose(handle)
                continue
            }
            let setThreads = dlsym(handle, "openblas_set_num_threads").map { unsafeBitCast($0, to: SetThreadsFunction.self) }
            let core = dlsym(handle, "openblas_get_corename").flatMap { unsafeBitCast($0, to: CoreNameFunction.self)() }.map { String(cString: $0) }
            let config = dlsym(handle, "openblas_get_config").flatMap { unsafeBitCast($0, to: CoreNameFunction.self)() }.map { String(cString: $0) }
            return BLASLibrary(
                name: name, core: core, isDynamicArch: config?.contains("DYNAMIC_ARCH") == true, sgemm: unsafeBitCast(symbol, to: SgemmFunction.self),
                setThreads: setThreads)
        }
        return nil
    }()

    /// `openblas_get_corename` and `openblas_get_config`: `char *(void)`.
    typealias CoreNameFunction = @convention(c) () -> UnsafeMutablePointer<CChar>?

    let name: String
    /// The kernels OpenBLAS runs (its `openblas_get_corename`), nil for another BLAS.
    let core: String?
    /// Whether it is an OpenBLAS built with the kernels of every core (DYNAMIC_ARCH in `openblas_get_config`), the
    /// kind that chooses them when it loads and takes `OPENBLAS_CORETYPE`.
    let isDynamicArch: Bool
    /// Whether its kernels are narrower than Orchard's own on this CPU (an OpenBLAS core without AVX2 and FMA on a
    /// CPU that has them), so that ``MatrixBackend/automatic`` leaves it alone.
    let isNarrowerThanOwnKernels: Bool
    private let sgemmFunction: SgemmFunction
    private let setThreadsFunction: SetThreadsFunction?

    /// Whether OpenBLAS's `core` runs narrower kernels than the AVX2 ones, on a CPU that has them (`thanAVX2`); an
    /// unnamed core (another BLAS) is taken at its word.
    static func isNarrower(core: String?, thanAVX2 avx2: Bool) -> Bool {
        avx2 && core.map { narrowCores.contains($0.lowercased()) } == true
    }

    private init(name: String, core: String?, isDynamicArch: Bool, sgemm: SgemmFunction, setThreads: SetThreadsFunction?) {
        self.name = name
        self.core = core
        self.isDynamicArch = isDynamicArch
        self.isNarrowerThanOwnKernels = Self.isNarrower(core: core, thanAVX2: AVX2GEMM.isAvailable)
        self.sgemmFunction = sgemm
        self.setThreadsFunction = setThreads
        setThreads?(1)
    }

    func setThreads(_ n: Int) { setThreadsFunction?(Int32(n)) }

    func sgemm(
        _ transposeA: Bool, _ transposeB: Bool, _ m: Int, _ n: Int, _ k: Int, _ alpha: Float,
        _ a: UnsafePointer<Float>, _ lda: Int, _ b: UnsafePointer<Float>, _ ldb: Int,
        _ beta: Float, _ c: UnsafeMutablePointer<Float>, _ ldc: Int
    ) {
        // CBLAS constants: row-major 101, no-transpose 111, transpose 112.
        sgemmFunction(
            101, transposeA ? 112 : 111, transposeB ? 112 : 111, Int32(m), Int32(n), Int32(k), alpha,
            a, Int32(lda), b, Int32(ldb), beta, c, Int32(ldc)
        )
    }
}

/// `acc += a * b` lane by lane, as one fused multiply-add where the compile target guarantees the instruction
/// (arm64 always; x86-64 when built with `ORCHARD_NATIVE=1` on an FMA-capable CPU), and as a multiply and an
/// add otherwise (a fused operation without hardware support would become a slow library call per lane).
@inline(__always)
func multiplyAdd(_ acc: inout SIMD8<Float>, _ a: SIMD8<Float>, _ b: SIMD8<Float>) {
    #if arch(arm64) || ORCHARD_NATIVE
    acc = acc.addingProduct(a, b)
    #else
    acc += a * b
    #endif
}
