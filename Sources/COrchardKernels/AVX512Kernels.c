#include "COrchardKernels.h"

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))

#include <immintrin.h>
#include <stdint.h>

#include "HorizontalSums.h"

// The AVX-512 counterparts of AVX2Kernels.c: 16-wide vectors, 32 registers (so taller tiles), and masked loads and
// stores for the tails. Compiled per function for AVX-512F (the rest of the package keeps the baseline instruction
// set); callers check orchard_avx512_available() first.
#define WIDE_TARGET __attribute__((target("avx512f,avx2,fma")))
#define WIDE_INLINE static inline __attribute__((always_inline)) WIDE_TARGET

bool orchard_avx512_available(void) {
    __builtin_cpu_init();
    // __builtin_cpu_supports also requires the operating system to save the ZMM state (XCR0), as for AVX.
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool orchard_avx512_skylake_subsets_available(void) {
    __builtin_cpu_init();
    return orchard_avx512_available() && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

/// A mask enabling the first `lanes` (0...16) lanes.
WIDE_INLINE __mmask16 wide_lanes(long lanes) { return (__mmask16)((1u << lanes) - 1u); }

/// C = beta · C (the whole product when k is 0 or alpha is 0).
static void wide_scale_c(long m, long n, float beta, float *c, long ldc) {
    if (beta == 1) return;
    for (long i = 0; i < m; ++i) {
        float *row = c + i * ldc;
        for (long j = 0; j < n; ++j) row[j] = beta == 0 ? 0 : beta * row[j];
    }
}

// MARK: A · Bᵀ — dot products of rows

// Tiles of up to 10 rows of A by 2 rows of B: 20 accumulators, 2 + 1 registers for the operands. A batch of 10 (the
// recipe's) is one panel, so B (a layer's weights, in L2) is swept once, not twice as with 6-row tiles; the sums are
// reduced 8 at a time (halved to 8 lanes, then added pairwise across registers), not one by one.
enum { WIDE_DOT_ROWS = 10, WIDE_DOT_COLS = 2, WIDE_DOT_DEPTH = 1024 };

/// The 16 lanes of v added down to 8.
WIDE_INLINE __m256 wide_halves(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/// One R × S tile of C from the dot products of R rows of A with S rows of B over k values.
WIDE_INLINE void wide_dot_tile(const int R, const int S, long k, const float *a, long lda, const float *b, long ldb,
                               float *c, long ldc, float alpha, float beta, bool first) {
    __m512 acc[WIDE_DOT_ROWS * WIDE_DOT_COLS];
    for (int t = 0; t < R * S; ++t) acc[t] = _mm512_setzero_ps();
    long p = 0;
    for (; p + 16 <= k; p += 16) {
        __m512 bv[WIDE_DOT_COLS];
        for (int s = 0; s < S; ++s) bv[s] = _mm512_loadu_ps(b + s * ldb + p);
        for (int r = 0; r < R; ++r) {
            __m512 av = _mm512_loadu_ps(a + r * lda + p);
            for (int s = 0; s < S; ++s) acc[r * S + s] = _mm512_fmadd_ps(av, bv[s], acc[r * S + s]);
        }
    }
    if (p < k) {
        __mmask16 mask = wide_lanes(k - p);
        __m512 bv[WIDE_DOT_COLS];
        for (int s = 0; s < S; ++s) bv[s] = _mm512_maskz_loadu_ps(mask, b + s * ldb + p);
        for (int r = 0; r < R; ++r) {
            __m512 av = _mm512_maskz_loadu_ps(mask, a + r * lda + p);
            for (int s = 0; s < S; ++s) acc[r * S + s] = _mm512_fmadd_ps(av, bv[s], acc[r * S + s]);
        }
    }
    // Padded to whole groups of 8 with zeros.
    __m256 halves[WIDE_DOT_ROWS * WIDE_DOT_COLS + 7];
    const int count = R * S, padded = (R * S + 7) & ~7;
    for (int t = 0; t < count; ++t) halves[t] = wide_halves(acc[t]);
    for (int t = count; t < padded; ++t) halves[t] = _mm256_setzero_ps();
    float sums[WIDE_DOT_ROWS * WIDE_DOT_COLS + 7];
    for (int t = 0; t < padded; t += 8) _mm256_storeu_ps(sums + t, orchard_sums8(halves + t));
    for (int r = 0; r < R; ++r) {
        for (int s = 0; s < S; ++s) {
            float v = alpha * sums[r * S + s];
            float *cp = c + r * ldc + s;
            if (!first) *cp += v;
            else if (beta == 0) *cp = v;
            else *cp = beta * *cp + v;
        }
    }
}

/// R rows of C (all n columns) over one slice of the depth.
WIDE_INLINE void wide_dot_panel(const int R, long n, long k, const float *a, long lda, const float *b, long ldb,
                                float *c, long ldc, float alpha, float beta, bool first) {
    long j = 0;
    for (; j + WIDE_DOT_COLS <= n; j += WIDE_DOT_COLS)
        wide_dot_tile(R, WIDE_DOT_COLS, k, a, lda, b + j * ldb, ldb, c + j, ldc, alpha, beta, first);
    for (; j < n; ++j) wide_dot_tile(R, 1, k, a, lda, b + j * ldb, ldb, c + j, ldc, alpha, beta, first);
}

WIDE_TARGET
void orchard_avx512_sgemm_nt(long m, long n, long k, float alpha, const float *a, long lda, const float *b, long ldb,
                             float beta, float *c, long ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || alpha == 0) {
        wide_scale_c(m, n, beta, c, ldc);
        return;
    }
    // Deep products in equal slices of at most WIDE_DOT_DEPTH values (multiples of 16), as the AVX2 kernel does.
    long slices = (k + WIDE_DOT_DEPTH - 1) / WIDE_DOT_DEPTH;
    long depth = ((k + slices - 1) / slices + 15) & ~15L;
    for (long p0 = 0; p0 < k; p0 += depth) {
        long kcur = k - p0 < depth ? k - p0 : depth;
        bool first = p0 == 0;
        for (long i = 0; i < m; i += WIDE_DOT_ROWS) {
            const float *ai = a + i * lda + p0;
            float *ci = c + i * ldc;
            const float *bp = b + p0;
            switch (m - i < WIDE_DOT_ROWS ? m - i : WIDE_DOT_ROWS) {
            case 10: wide_dot_panel(10, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 9: wide_dot_panel(9, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 8: wide_dot_panel(8, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 7: wide_dot_panel(7, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 6: wide_dot_panel(6, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 5: wide_dot_panel(5, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 4: wide_dot_panel(4, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 3: wide_dot_panel(3, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 2: wide_dot_panel(2, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            default: wide_dot_panel(1, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            }
        }
    }
}

// MARK: op(A) · B — rows of B scaled by entries of A

enum { WIDE_ROW_ROWS = 8 };

/// One R-row tile of C, V vectors (of 16 columns) wide; the last vector covers only the lanes in `mask`.
WIDE_INLINE void wide_row_tile(const int R, const int V, __mmask16 mask, long k, const float *a, long ars, long aks,
                               const float *b, long ldb, float *c, long ldc, float alpha, float beta) {
    __m512 acc[WIDE_ROW_ROWS][2];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    for (long p = 0; p < k; ++p) {
        const float *bp = b + p * ldb;
        __m512 bv[2];
        for (int v = 0; v < V; ++v) bv[v] = v == V - 1 ? _mm512_maskz_loadu_ps(mask, bp + 16 * v) : _mm512_loadu_ps(bp + 16 * v);
        const float *ap = a + p * aks;
        for (int r = 0; r < R; ++r) {
            __m512 av = _mm512_set1_ps(ap[r * ars]);
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < R; ++r) {
        float *cp = c + r * ldc;
        for (int v = 0; v < V; ++v) {
            __mmask16 lanes = v == V - 1 ? mask : (__mmask16)0xFFFF;
            __m512 x = _mm512_mul_ps(va, acc[r][v]);
            if (beta != 0) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(lanes, cp + 16 * v), x);
            _mm512_mask_storeu_ps(cp + 16 * v, lanes, x);
        }
    }
}

/// An R-row tile of C, `cols` (1...32) columns wide.
WIDE_INLINE void wide_row_tile_columns(const int R, long cols, long k, const float *a, long ars, long aks,
                                       const float *b, long ldb, float *c, long ldc, float alpha, float beta) {
    if (cols > 16) {
        wide_row_tile(R, 2, wide_lanes(cols - 16), k, a, ars, aks, b, ldb, c, ldc, alpha, beta);
    } else {
        wide_row_tile(R, 1, wide_lanes(cols), k, a, ars, aks, b, ldb, c, ldc, alpha, beta);
    }
}

WIDE_TARGET
void orchard_avx512_sgemm_xn(bool transpose_a, long m, long n, long k, float alpha, const float *a, long lda,
                             const float *b, long ldb, float beta, float *c, long ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || alpha == 0) {
        wide_scale_c(m, n, beta, c, ldc);
        return;
    }
    long ars = transpose_a ? 1 : lda, aks = transpose_a ? lda : 1;
    // Column strips of 32 outside, row tiles of 8 inside: a strip of B (k × 32) stays in L1 while every row tile uses it.
    for (long j = 0; j < n; j += 32) {
        long cols = n - j < 32 ? n - j : 32;
        for (long i = 0; i < m; i += WIDE_ROW_ROWS) {
            const float *ai = a + i * ars;
            float *cij = c + i * ldc + j;
            const float *bj = b + j;
            switch (m - i < WIDE_ROW_ROWS ? m - i : WIDE_ROW_ROWS) {
            case 8: wide_row_tile_columns(8, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 7: wide_row_tile_columns(7, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 6: wide_row_tile_columns(6, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 5: wide_row_tile_columns(5, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 4: wide_row_tile_columns(4, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 3: wide_row_tile_columns(3, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 2: wide_row_tile_columns(2, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            default: wide_row_tile_columns(1, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            }
        }
    }
}

#else

bool orchard_avx512_available(void) { return false; }

bool orchard_avx512_skylake_subsets_available(void) { return false; }

void orchard_avx512_sgemm_nt(long m, long n, long k, float alpha, const float *a, long lda, const float *b, long ldb,
                             float beta, float *c, long ldc) {
    (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb; (void)beta; (void)c; (void)ldc;
    __builtin_trap();
}

void orchard_avx512_sgemm_xn(bool transpose_a, long m, long n, long k, float alpha, const float *a, long lda,
                             const float *b, long ldb, float beta, float *c, long ldc) {
    (void)transpose_a; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb;
    (void)beta; (void)c; (void)ldc;
    __builtin_trap();
}

#endif
