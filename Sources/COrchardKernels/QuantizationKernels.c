#include "COrchardKernels.h"

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))

#include <immintrin.h>
#include <stdint.h>

// Secure aggregation's stochastic rounding (OrchardPrivacy's SecureAggregationQuantization), four coordinates a vector
// in double precision: the same operations, in the same order and precision, as the Swift path, so the levels are the
// same bit for bit. Value i takes the low (i even) or high (i odd) half of draws[i / 2] as its uniform fraction.
// Compiled for AVX2 and called only after orchard_avx2_available() said yes.

#define QUANT_AVX2 __attribute__((target("avx2")))

QUANT_AVX2 bool orchard_avx2_quantize(long count, const float *values, const uint64_t *draws, double clip, double scale, double top,
                                      uint32_t *levels) {
    const __m256d low = _mm256_set1_pd(-clip), high = _mm256_set1_pd(clip), scales = _mm256_set1_pd(scale);
    const __m256d tops = _mm256_set1_pd(top), lift = _mm256_set1_pd(0x1p52), fraction = _mm256_set1_pd(0x1p-32);
    const __m256d one = _mm256_set1_pd(1.0);
    __m256d nan_lanes = _mm256_setzero_pd();
    long i = 0;
    for (; i + 4 <= count; i += 4) {
        __m128i halves = _mm_loadu_si128((const __m128i *)(draws + i / 2));  // four 32-bit halves, low half first
        // Each half as a double: 2^52 + h has h in its low bits, exactly.
        __m256i wide = _mm256_cvtepu32_epi64(halves);
        __m256d uniform = _mm256_mul_pd(_mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(wide, _mm256_castpd_si256(lift))), lift), fraction);
        __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(values + i));
        nan_lanes = _mm256_or_pd(nan_lanes, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
        x = _mm256_blendv_pd(x, low, _mm256_cmp_pd(x, low, _CMP_LT_OQ));
        x = _mm256_blendv_pd(x, high, _mm256_cmp_pd(x, high, _CMP_GT_OQ));
        __m256d u = _mm256_mul_pd(_mm256_add_pd(x, high), scales);
        u = _mm256_blendv_pd(u, tops, _mm256_cmp_pd(u, tops, _CMP_GT_OQ));
        __m256d nearest = _mm256_sub_pd(_mm256_add_pd(u, lift), lift);
        __m256d floor = _mm256_blendv_pd(nearest, _mm256_sub_pd(nearest, one), _mm256_cmp_pd(nearest, u, _CMP_GT_OQ));
        floor = _mm256_blendv_pd(floor, _mm256_add_pd(floor, one), _mm256_cmp_pd(uniform, _mm256_sub_pd(u, floor), _CMP_LT_OQ));
        floor = _mm256_blendv_pd(floor, tops, _mm256_cmp_pd(floor, tops, _CMP_GT_OQ));
        // The level is below 2^32: adding 2^52 puts it in the low 32 bits of each lane's pattern.
        __m256i bits = _mm256_castpd_si256(_mm256_add_pd(floor, lift));
        __m256i packed = _mm256_permutevar8x32_epi32(bits, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        _mm_storeu_si128((__m128i *)(levels + i), _mm256_castsi256_si128(packed));
    }
    bool saw_nan = _mm256_movemask_pd(nan_lanes) != 0;
    for (; i < count; i++) {
        uint64_t draw = draws[i / 2];
        double uniform = (double)(uint32_t)((i & 1) ? (draw >> 32) : draw) * 0x1p-32;
        float value = values[i];
        if (value != value) {
            saw_nan = true;
            levels[i] = 0;
            continue;
        }
        double x = (double)value;
        if (x < -clip) x = -clip;
        if (x > clip) x = clip;
        double u = (x + clip) * scale;
        if (u > top) u = top;
        uint32_t floor = (uint32_t)u;
        uint32_t level = floor + (uniform < u - (double)floor ? 1u : 0u);
        levels[i] = level > (uint32_t)top ? (uint32_t)top : level;
    }
    return saw_nan;
}

#else

bool orchard_avx2_quantize(long count, const float *values, const uint64_t *draws, double clip, double scale, double top, uint32_t *levels) {
    (void)count; (void)values; (void)draws; (void)clip; (void)scale; (void)top; (void)levels;
    __builtin_trap();
}

#endif
