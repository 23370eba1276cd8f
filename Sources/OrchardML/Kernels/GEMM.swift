#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization

/// Which implementation runs matrix multiplies.
public struct MatrixBackend: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable { case portable, blas }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Orchard's own blocked SIMD kernel; always available.
    public static let portable = MatrixBackend(.portable)
    /// The system BLAS (OpenBLAS on Linux, Accelerate on Apple), loaded at run time when present.
    public static let blas = MatrixBackend(.blas)

    public var description: String { kind.rawValue }
}

/// Single-precision general matrix multiply, row-major: `C = alpha · op(A) · op(B) + beta · C`.
///
/// The system BLAS is used when it can be loaded (nothing is linked at build time, so a machine without it
/// still builds and runs); Orchard's portable kernel runs otherwise, or when `ORCHARD_BLAS=off` is set or
/// ``GEMM/setBackend(_:)`` selects it. ``GEMM/backend`` always tells which one is active.
public enum GEMM {
    private struct Settings: Sendable {
        var backend: MatrixBackend
        var threads: Int
    }

    private static let settings: Mutex<Settings> = Mutex(Settings(
        backend: BLASLibrary.shared != nil ? .blas : .portable,
        threads: 1
    ))

    /// The backend that runs the next multiply.
    public static var backend: MatrixBackend { settings.withLock { $0.backend } }

    /// Whether a system BLAS was found and loaded.
    public static var isBLASAvailable: Bool { BLASLibrary.shared != nil }

    /// Number of threads a multiply may use.
    public static var threads: Int { settings.withLock { $0.threads } }

    /// Selects the backend; selecting `.blas` when no BLAS was found is an error.
    public static func setBackend(_ backend: MatrixBackend) throws(EngineError) {
        if backend == .blas && BLASLibrary.shared == nil {
            throw EngineError(.unavailable, "no system BLAS could be loaded (looked for \(BLASLibrary.candidates.joined(separator: ", ")))")
        }
        settings.withLock { $0.backend = backend }
    }

    /// Sets how many threads a multiply may use (at least 1).
    public static func setThreads(_ count: Int) {
        let n = max(1, count)
        settings.withLock { $0.threads = n }
        BLASLibrary.shared?.setThreads(n)
    }

    /// Computes `C = alpha · op(A) · op(B) + beta · C` for row-major matrices.
    /// - Parameters:
    ///   - transposeA: Use Aᵀ; A is then stored `k × m`.
    ///   - transposeB: Use Bᵀ; B is then stored `n × k`.
    ///   - m: Rows of op(A) and C.
    ///   - n: Columns of op(B) and C.
    ///   - k: Columns of op(A), rows of op(B).
    ///   - lda: Row stride of A as stored.
    ///   - ldb: Row stride of B as stored.
    ///   - ldc: Row stride of C.
    ///   - chosen: Run on this backend instead of the configured one (`.blas` needs ``isBLASAvailable``).
    @inlinable
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
        let (current, threads) = currentSettings()
        let backend = chosen ?? current
        if backend == .blas, let blas = BLASLibrary.shared {
            blas.sgemm(transposeA, transposeB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
            return
        }
        PortableGEMM.multiply(
            transposeA: transposeA, transposeB: transposeB, m: m, n: n, k: k, alpha: alpha,
            a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc, threads: threads
        )
    }

    @usableFromInline
    static func currentSettings() -> (MatrixBackend, Int) {
        settings.withLock { ($0.backend, $0.threads) }
    }
}

/// The system BLAS, opened with `dlopen` so that nothing is linked at build time.
@usableFromInline
final class BLASLibrary: Sendable {
    typealias SgemmFunction = @convention(c) (
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

    @usableFromInline
    static let shared: BLASLibrary? = {
        if let setting = getenv("ORCHARD_BLAS").map({ String(cString: $0) }), ["off", "0", "no", "false"].contains(setting.lowercased()) {
            return nil
        }
        for name in candidates {
            guard let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) else { continue }
            guard let symbol = dlsym(handle, "cblas_sgemm") else {
                dlclose(handle)
                continue
            }
            let setThreads = dlsym(handle, "openblas_set_num_threads").map { unsafeBitCast($0, to: SetThreadsFunction.self) }
            return BLASLibrary(name: name, sgemm: unsafeBitCast(symbol, to: SgemmFunction.self), setThreads: setThreads)
        }
        return nil
    }()

    let name: String
    private let sgemmFunction: SgemmFunction
    private let setThreadsFunction: SetThreadsFunction?

    private init(name: String, sgemm: SgemmFunction, setThreads: SetThreadsFunction?) {
        self.name = name
        self.sgemmFunction = sgemm
        self.setThreadsFunction = setThreads
        setThreads?(1)
    }

    func setThreads(_ n: Int) { setThreadsFunction?(Int32(n)) }

    @usableFromInline
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
