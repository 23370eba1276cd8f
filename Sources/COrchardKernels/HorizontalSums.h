// Shared by the AVX2 and AVX-512 kernels; included inside their x86-64 guards, after <immintrin.h>.
#ifndef ORCHARD_HORIZONTAL_SUMS_H
#define ORCHARD_HORIZONTAL_SUMS_H

/// Lane i of the result is the sum of the lanes of v[i], for eight 8-lane vectors.
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 orchard_sums8(const __m256 *v) {
    __m256 t0 = _mm256_hadd_ps(v[0], v[1]);
    __m256 t1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 t2 = _mm256_hadd_ps(v[4], v[5]);
    __m256 t3 = _mm256_hadd_ps(v[6], v[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1);
    __m256 u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#endif
