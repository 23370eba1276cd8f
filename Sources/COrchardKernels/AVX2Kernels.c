#include "COrchardKernels.h"

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))

#include <immintrin.h>
#include <stdint.h>

#include "HorizontalSums.h"

// Every function that uses AVX2 or FMA instructions is compiled for them individually, so the rest of the
// package keeps the baseline instruction set; callers check orchard_avx2_available() first.
#define ORCHARD_TARGET __attribute__((target("avx2,fma")))
#define ORCHARD_INLINE static inline __attribute__((always_inline)) ORCHARD_TARGET

bool orchard_avx2_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static const int32_t lane_masks[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/// A mask enabling the first `lanes` (1...8) lanes.
ORCHARD_INLINE __m256i first_lanes(long lanes) {
    return _mm256_loadu_si256((const __m256i *)(lane_masks + 8 - lanes));
}

/// The sum of the eight lanes.
ORCHARD_INLINE float horizontal_sum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/// C = beta · C (the whole product when k is 0 or alpha is 0).
static void scale_c(long m, long n, float beta, float *c, long ldc) {
    if (beta == 1) return;
    for (long i = 0; i < m; ++i) {
        float *row = c + i * ldc;
        for (long j = 0; j < n; ++j) row[j] = beta == 0 ? 0 : beta * row[j];
    }
}

// MARK: A · Bᵀ — dot products of rows

enum { DOT_ROWS = 5, DOT_COLS = 2, DOT_DEPTH = 1024 };

/// One R × S tile of C from the dot products of R rows of A with S rows of B over k values. `first` tells
/// whether this is the first slice of the depth (apply beta) or a later one (add).
ORCHARD_INLINE void dot_tile(const int R, const int S, long k, const float *a, long lda, const float *b, long ldb,
                             float *c, long ldc, float alpha, float beta, bool first) {
    __m256 acc[DOT_ROWS * DOT_COLS];
    for (int t = 0; t < R * S; ++t) acc[t] = _mm256_setzero_ps();
    long p = 0;
    for (; p + 8 <= k; p += 8) {
        __m256 bv[DOT_COLS];
        for (int s = 0; s < S; ++s) bv[s] = _mm256_loadu_ps(b + s * ldb + p);
        for (int r = 0; r < R; ++r) {
            __m256 av = _mm256_loadu_ps(a + r * lda + p);
            for (int s = 0; s < S; ++s) acc[r * S + s] = _mm256_fmadd_ps(av, bv[s], acc[r * S + s]);
        }
    }
    if (p < k) {
        __m256i mask = first_lanes(k - p);
        __m256 bv[DOT_COLS];
        for (int s = 0; s < S; ++s) bv[s] = _mm256_maskload_ps(b + s * ldb + p, mask);
        for (int r = 0; r < R; ++r) {
            __m256 av = _mm256_maskload_ps(a + r * lda + p, mask);
            for (int s = 0; s < S; ++s) acc[r * S + s] = _mm256_fmadd_ps(av, bv[s], acc[r * S + s]);
        }
    }
    float sums[16];
    int t = 0;
    for (; t + 8 <= R * S; t += 8) _mm256_storeu_ps(sums + t, orchard_sums8(acc + t));
    for (; t < R * S; ++t) sums[t] = horizontal_sum(acc[t]);
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
ORCHARD_INLINE void dot_panel(const int R, long n, long k, const float *a, long lda, const float *b, long ldb,
                              float *c, long ldc, float alpha, float beta, bool first) {
    long j = 0;
    for (; j + DOT_COLS <= n; j += DOT_COLS) dot_tile(R, DOT_COLS, k, a, lda, b + j * ldb, ldb, c + j, ldc, alpha, beta, first);
    for (; j < n; ++j) dot_tile(R, 1, k, a, lda, b + j * ldb, ldb, c + j, ldc, alpha, beta, first);
}

ORCHARD_TARGET
void orchard_avx2_sgemm_nt(long m, long n, long k, float alpha, const float *a, long lda, const float *b, long ldb,
                           float beta, float *c, long ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || alpha == 0) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    // Very deep products go in equal slices of at most DOT_DEPTH values (multiples of 8), so that the slice of B
    // the rows of A sweep stays in the core's L2 cache. Shallower ones are not sliced: on the development VM's
    // EPYC, a 784-deep product ran about 12 % faster whole (the reductions and the stores to C of each tile
    // cost as much as the L2 misses saved) than in slices of 256.
    long slices = (k + DOT_DEPTH - 1) / DOT_DEPTH;
    long depth = ((k + slices - 1) / slices + 7) & ~7L;
    for (long p0 = 0; p0 < k; p0 += depth) {
        long kcur = k - p0 < depth ? k - p0 : depth;
        bool first = p0 == 0;
        for (long i = 0; i < m; i += DOT_ROWS) {
            const float *ai = a + i * lda + p0;
            float *ci = c + i * ldc;
            const float *bp = b + p0;
            switch (m - i < DOT_ROWS ? m - i : DOT_ROWS) {
            case 5: dot_panel(5, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 4: dot_panel(4, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 3: dot_panel(3, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            case 2: dot_panel(2, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            default: dot_panel(1, n, kcur, ai, lda, bp, ldb, ci, ldc, alpha, beta, first); break;
            }
        }
    }
}

// MARK: op(A) · B — rows of B scaled by entries of A

enum { ROW_ROWS = 6 };

/// One R-row tile of C, V vectors (of 8 columns) wide; when `masked`, the last vector covers only the lanes
/// in `mask`. `ars` and `aks` are A's strides along rows of op(A) and along the depth.
ORCHARD_INLINE void row_tile(const int R, const int V, const bool masked, __m256i mask, long k,
                             const float *a, long ars, long aks, const float *b, long ldb,
                             float *c, long ldc, float alpha, float beta) {
    __m256 acc[ROW_ROWS][2];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
    for (long p = 0; p < k; ++p) {
        const float *bp = b + p * ldb;
        __m256 bv[2];
        for (int v = 0; v < V; ++v)
            bv[v] = (masked && v == V - 1) ? _mm256_maskload_ps(bp + 8 * v, mask) : _mm256_loadu_ps(bp + 8 * v);
        const float *ap = a + p * aks;
        for (int r = 0; r < R; ++r) {
            __m256 av = _mm256_broadcast_ss(ap + r * ars);
            for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    for (int r = 0; r < R; ++r) {
        float *cp = c + r * ldc;
        for (int v = 0; v < V; ++v) {
            bool partial = masked && v == V - 1;
            __m256 x = _mm256_mul_ps(va, acc[r][v]);
            if (beta != 0) {
                __m256 old = partial ? _mm256_maskload_ps(cp + 8 * v, mask) : _mm256_loadu_ps(cp + 8 * v);
                x = _mm256_fmadd_ps(vb, old, x);
            }
            if (partial) _mm256_maskstore_ps(cp + 8 * v, mask, x);
            else _mm256_storeu_ps(cp + 8 * v, x);
        }
    }
}

/// An R-row tile of C, `cols` (1...16) columns wide.
ORCHARD_INLINE void row_tile_columns(const int R, long cols, long k, const float *a, long ars, long aks,
                                     const float *b, long ldb, float *c, long ldc, float alpha, float beta) {
    if (cols == 16) {
        row_tile(R, 2, false, _mm256_setzero_si256(), k, a, ars, aks, b, ldb, c, ldc, alpha, beta);
    } else if (cols > 8) {
        row_tile(R, 2, true, first_lanes(cols - 8), k, a, ars, aks, b, ldb, c, ldc, alpha, beta);
    } else {
        row_tile(R, 1, true, first_lanes(cols), k, a, ars, aks, b, ldb, c, ldc, alpha, beta);
    }
}

ORCHARD_TARGET
void orchard_avx2_sgemm_xn(bool transpose_a, long m, long n, long k, float alpha, const float *a, long lda,
                           const float *b, long ldb, float beta, float *c, long ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || alpha == 0) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    long ars = transpose_a ? 1 : lda, aks = transpose_a ? lda : 1;
    // Column strips outside, row tiles inside: a strip of B (k × 16) is read from memory once and stays in L1
    // while every row tile uses it.
    for (long j = 0; j < n; j += 16) {
        long cols = n - j < 16 ? n - j : 16;
        for (long i = 0; i < m; i += ROW_ROWS) {
            const float *ai = a + i * ars;
            float *cij = c + i * ldc + j;
            const float *bj = b + j;
            switch (m - i < ROW_ROWS ? m - i : ROW_ROWS) {
            case 6: row_tile_columns(6, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 5: row_tile_columns(5, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 4: row_tile_columns(4, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 3: row_tile_columns(3, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            case 2: row_tile_columns(2, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            default: row_tile_columns(1, cols, k, ai, ars, aks, bj, ldb, cij, ldc, alpha, beta); break;
            }
        }
    }
}

#else

bool orchard_avx2_available(void) { return false; }

void orchard_avx2_sgemm_nt(long m, long n, long k, float alpha, const float *a, long lda, const float *b, long ldb,
                           float beta, float *c, long ldc) {
    (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb; (void)beta; (void)c; (void)ldc;
    __builtin_trap();
}

void orchard_avx2_sgemm_xn(bool transpose_a, long m, long n, long k, float alpha, const float *a, long lda,
                           const float *b, long ldb, float beta, float *c, long ldc) {
    (void)transpose_a; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb;
    (void)beta; (void)c; (void)ldc;
    __builtin_trap();
}

#endif
