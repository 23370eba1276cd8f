#include "COrchardKernels.h"

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))

#include <immintrin.h>
#include <stdint.h>

// The LSTM and CIFG cell's element-wise work, per step: the gate activations and the cell update forward, their
// gradients backward. The matrix products around them run on the GEMM kernels; this is the rest of a step, which the
// baseline Swift build would run on 4-wide SSE without FMA. Each function is compiled for its instruction set and
// called only after orchard_avx2_available() / orchard_avx512_available() said yes. The exponential is the same Cephes
// reduction and polynomial as OrchardML's eight-lane Swift `exp`; with FMA the results differ from it by rounding only.

#define CELL_AVX2 __attribute__((target("avx2,fma")))
#define CELL_AVX2_INLINE static inline __attribute__((always_inline)) CELL_AVX2
#define CELL_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define CELL_AVX512_INLINE static inline __attribute__((always_inline)) CELL_AVX512

// MARK: AVX2 (8 lanes)

/// e^x for eight lanes (inputs clamped to ±87; NaN stays NaN).
CELL_AVX2_INLINE __m256 avx2_exp(__m256 x) {
    // max/min return their second operand when either is NaN: x second, so NaN propagates.
    x = _mm256_min_ps(_mm256_set1_ps(87.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
    const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 × 2²³: adding it rounds to an integer in the low bits
    __m256 shifted = _mm256_fmadd_ps(x, _mm256_set1_ps(1.4426950408889634f), magic);
    __m256 n = _mm256_sub_ps(shifted, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_castps_si256(magic));
    bits = _mm256_slli_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}

CELL_AVX2_INLINE __m256 avx2_sigmoid(__m256 x) {
    __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, avx2_exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

CELL_AVX2_INLINE __m256 avx2_tanh(__m256 x) {
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = avx2_exp(_mm256_add_ps(x, x));
    return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

static const int32_t cell_lane_masks[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/// Loads `width` (1...8) lanes; the others are zero.
CELL_AVX2_INLINE __m256 avx2_load(const float *p, long width, __m256i mask) {
    return width == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}

CELL_AVX2_INLINE void avx2_store(float *p, __m256 v, long width, __m256i mask) {
    if (width == 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, mask, v);
}

CELL_AVX2
void orchard_avx2_lstm_forward(bool cifg, long rows, long hidden, float *gates, long gate_stride, const float *cell_previous,
                               float *cell, float *state) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (long r = 0; r < rows; ++r) {
        float *in = gates + r * gate_stride;
        float *forget = cifg ? in : in + hidden;
        float *candidate = cifg ? in + hidden : in + 2 * hidden;
        float *out = cifg ? in + 2 * hidden : in + 3 * hidden;
        for (long j = 0; j < hidden; j += 8) {
            long w = hidden - j < 8 ? hidden - j : 8;
            __m256i mask = _mm256_loadu_si256((const __m256i *)(cell_lane_masks + 8 - w));
            __m256 i = avx2_sigmoid(avx2_load(in + j, w, mask));
            __m256 f;
            if (cifg) {
                f = _mm256_sub_ps(one, i);
            } else {
                f = avx2_sigmoid(avx2_load(forget + j, w, mask));
                avx2_store(forget + j, f, w, mask);
            }
            __m256 g = avx2_tanh(avx2_load(candidate + j, w, mask));
            __m256 o = avx2_sigmoid(avx2_load(out + j, w, mask));
            avx2_store(in + j, i, w, mask);
            avx2_store(candidate + j, g, w, mask);
            avx2_store(out + j, o, w, mask);
            __m256 previous = cell_previous ? avx2_load(cell_previous + r * hidden + j, w, mask) : _mm256_setzero_ps();
            __m256 c = _mm256_fmadd_ps(f, previous, _mm256_mul_ps(i, g));
            avx2_store(cell + r * hidden + j, c, w, mask);
            avx2_store(state + r * hidden + j, _mm256_mul_ps(o, avx2_tanh(c)), w, mask);
        }
    }
}

CELL_AVX2
void orchard_avx2_lstm_backward(bool cifg, long rows, long hidden, const float *gates, long gate_stride, const float *cell,
                                const float *cell_previous, const float *dh_next, const float *dy, long dy_stride, float *dc,
                                float *dgates) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (long r = 0; r < rows; ++r) {
        const float *in = gates + r * gate_stride;
        const float *forget = cifg ? in : in + hidden;
        const float *candidate = cifg ? in + hidden : in + 2 * hidden;
        const float *out = cifg ? in + 2 * hidden : in + 3 * hidden;
        float *d = dgates + r * gate_stride;
        for (long j = 0; j < hidden; j += 8) {
            long w = hidden - j < 8 ? hidden - j : 8;
            __m256i mask = _mm256_loadu_si256((const __m256i *)(cell_lane_masks + 8 - w));
            long at = r * hidden + j;
            __m256 c = avx2_load(cell + at, w, mask);
            __m256 tc = avx2_tanh(c);
            __m256 previous = cell_previous ? avx2_load(cell_previous + at, w, mask) : _mm256_setzero_ps();
            __m256 i = avx2_load(in + j, w, mask), g = avx2_load(candidate + j, w, mask), o = avx2_load(out + j, w, mask);
            __m256 f = cifg ? _mm256_sub_ps(one, i) : avx2_load(forget + j, w, mask);
            __m256 dh = avx2_load(dh_next + at, w, mask);
            if (dy) dh = _mm256_add_ps(dh, avx2_load(dy + r * dy_stride + j, w, mask));
            __m256 dcv = _mm256_fmadd_ps(_mm256_mul_ps(dh, o), _mm256_fnmadd_ps(tc, tc, one), avx2_load(dc + at, w, mask));
            __m256 dO = _mm256_mul_ps(_mm256_mul_ps(dh, tc), _mm256_mul_ps(o, _mm256_sub_ps(one, o)));
            __m256 dG = _mm256_mul_ps(_mm256_mul_ps(dcv, i), _mm256_fnmadd_ps(g, g, one));
            __m256 di = _mm256_mul_ps(i, _mm256_sub_ps(one, i));
            if (cifg) {
                // f = 1 − i: the forget path's gradient reaches i with the opposite sign.
                avx2_store(d + j, _mm256_mul_ps(_mm256_mul_ps(dcv, _mm256_sub_ps(g, previous)), di), w, mask);
                avx2_store(d + hidden + j, dG, w, mask);
                avx2_store(d + 2 * hidden + j, dO, w, mask);
            } else {
                avx2_store(d + j, _mm256_mul_ps(_mm256_mul_ps(dcv, g), di), w, mask);
                avx2_store(d + hidden + j, _mm256_mul_ps(_mm256_mul_ps(dcv, previous), _mm256_mul_ps(f, _mm256_sub_ps(one, f))), w, mask);
                avx2_store(d + 2 * hidden + j, dG, w, mask);
                avx2_store(d + 3 * hidden + j, dO, w, mask);
            }
            avx2_store(dc + at, _mm256_mul_ps(dcv, f), w, mask);
        }
    }
}

// MARK: AVX-512 (16 lanes)

CELL_AVX512_INLINE __m512 wide_exp(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(87.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), x));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 shifted = _mm512_fmadd_ps(x, _mm512_set1_ps(1.4426950408889634f), magic);
    __m512 n = _mm512_sub_ps(shifted, magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_castps_si512(magic));
    bits = _mm512_slli_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
}

CELL_AVX512_INLINE __m512 wide_sigmoid(__m512 x) {
    __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, wide_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

CELL_AVX512_INLINE __m512 wide_tanh(__m512 x) {
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 e = wide_exp(_mm512_add_ps(x, x));
    return _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
}

CELL_AVX512
void orchard_avx512_lstm_forward(bool cifg, long rows, long hidden, float *gates, long gate_stride, const float *cell_previous,
                                 float *cell, float *state) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (long r = 0; r < rows; ++r) {
        float *in = gates + r * gate_stride;
        float *forget = cifg ? in : in + hidden;
        float *candidate = cifg ? in + hidden : in + 2 * hidden;
        float *out = cifg ? in + 2 * hidden : in + 3 * hidden;
        for (long j = 0; j < hidden; j += 16) {
            __mmask16 m = (__mmask16)(hidden - j >= 16 ? 0xFFFF : (1u << (hidden - j)) - 1u);
            __m512 i = wide_sigmoid(_mm512_maskz_loadu_ps(m, in + j));
            __m512 f;
            if (cifg) {
                f = _mm512_sub_ps(one, i);
            } else {
                f = wide_sigmoid(_mm512_maskz_loadu_ps(m, forget + j));
                _mm512_mask_storeu_ps(forget + j, m, f);
            }
            __m512 g = wide_tanh(_mm512_maskz_loadu_ps(m, candidate + j));
            __m512 o = wide_sigmoid(_mm512_maskz_loadu_ps(m, out + j));
            _mm512_mask_storeu_ps(in + j, m, i);
            _mm512_mask_storeu_ps(candidate + j, m, g);
            _mm512_mask_storeu_ps(out + j, m, o);
            __m512 previous = cell_previous ? _mm512_maskz_loadu_ps(m, cell_previous + r * hidden + j) : _mm512_setzero_ps();
            __m512 c = _mm512_fmadd_ps(f, previous, _mm512_mul_ps(i, g));
            _mm512_mask_storeu_ps(cell + r * hidden + j, m, c);
            _mm512_mask_storeu_ps(state + r * hidden + j, m, _mm512_mul_ps(o, wide_tanh(c)));
        }
    }
}

CELL_AVX512
void orchard_avx512_lstm_backward(bool cifg, long rows, long hidden, const float *gates, long gate_stride, const float *cell,
                                  const float *cell_previous, const float *dh_next, const float *dy, long dy_stride, float *dc,
                                  float *dgates) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (long r = 0; r < rows; ++r) {
        const float *in = gates + r * gate_stride;
        const float *forget = cifg ? in : in + hidden;
        const float *candidate = cifg ? in + hidden : in + 2 * hidden;
        const float *out = cifg ? in + 2 * hidden : in + 3 * hidden;
        float *d = dgates + r * gate_stride;
        for (long j = 0; j < hidden; j += 16) {
            __mmask16 m = (__mmask16)(hidden - j >= 16 ? 0xFFFF : (1u << (hidden - j)) - 1u);
            long at = r * hidden + j;
            __m512 c = _mm512_maskz_loadu_ps(m, cell + at);
            __m512 tc = wide_tanh(c);
            __m512 previous = cell_previous ? _mm512_maskz_loadu_ps(m, cell_previous + at) : _mm512_setzero_ps();
            __m512 i = _mm512_maskz_loadu_ps(m, in + j), g = _mm512_maskz_loadu_ps(m, candidate + j);
            __m512 o = _mm512_maskz_loadu_ps(m, out + j);
            __m512 f = cifg ? _mm512_sub_ps(one, i) : _mm512_maskz_loadu_ps(m, forget + j);
            __m512 dh = _mm512_maskz_loadu_ps(m, dh_next + at);
            if (dy) dh = _mm512_add_ps(dh, _mm512_maskz_loadu_ps(m, dy + r * dy_stride + j));
            __m512 dcv = _mm512_fmadd_ps(_mm512_mul_ps(dh, o), _mm512_fnmadd_ps(tc, tc, one), _mm512_maskz_loadu_ps(m, dc + at));
            __m512 dO = _mm512_mul_ps(_mm512_mul_ps(dh, tc), _mm512_mul_ps(o, _mm512_sub_ps(one, o)));
            __m512 dG = _mm512_mul_ps(_mm512_mul_ps(dcv, i), _mm512_fnmadd_ps(g, g, one));
            __m512 di = _mm512_mul_ps(i, _mm512_sub_ps(one, i));
            if (cifg) {
                _mm512_mask_storeu_ps(d + j, m, _mm512_mul_ps(_mm512_mul_ps(dcv, _mm512_sub_ps(g, previous)), di));
                _mm512_mask_storeu_ps(d + hidden + j, m, dG);
                _mm512_mask_storeu_ps(d + 2 * hidden + j, m, dO);
            } else {
                _mm512_mask_storeu_ps(d + j, m, _mm512_mul_ps(_mm512_mul_ps(dcv, g), di));
                _mm512_mask_storeu_ps(d + hidden + j, m, _mm512_mul_ps(_mm512_mul_ps(dcv, previous), _mm512_mul_ps(f, _mm512_sub_ps(one, f))));
                _mm512_mask_storeu_ps(d + 2 * hidden + j, m, dG);
                _mm512_mask_storeu_ps(d + 3 * hidden + j, m, dO);
            }
            _mm512_mask_storeu_ps(dc + at, m, _mm512_mul_ps(dcv, f));
        }
    }
}

#else

void orchard_avx2_lstm_forward(bool cifg, long rows, long hidden, float *gates, long gate_stride, const float *cell_previous,
                               float *cell, float *state) {
    (void)cifg; (void)rows; (void)hidden; (void)gates; (void)gate_stride; (void)cell_previous; (void)cell; (void)state;
    __builtin_trap();
}

void orchard_avx2_lstm_backward(bool cifg, long rows, long hidden, const float *gates, long gate_stride, const float *cell,
                                const float *cell_previous, const float *dh_next, const float *dy, long dy_stride, float *dc,
                                float *dgates) {
    (void)cifg; (void)rows; (void)hidden; (void)gates; (void)gate_stride; (void)cell; (void)cell_previous; (void)dh_next;
    (void)dy; (void)dy_stride; (void)dc; (void)dgates;
    __builtin_trap();
}

void orchard_avx512_lstm_forward(bool cifg, long rows, long hidden, float *gates, long gate_stride, const float *cell_previous,
                                 float *cell, float *state) {
    orchard_avx2_lstm_forward(cifg, rows, hidden, gates, gate_stride, cell_previous, cell, state);
}

void orchard_avx512_lstm_backward(bool cifg, long rows, long hidden, const float *gates, long gate_stride, const float *cell,
                                  const float *cell_previous, const float *dh_next, const float *dy, long dy_stride, float *dc,
                                  float *dgates) {
    orchard_avx2_lstm_backward(cifg, rows, hidden, gates, gate_stride, cell, cell_previous, dh_next, dy, dy_stride, dc, dgates);
}

#endif
