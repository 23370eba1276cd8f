#ifndef ORCHARD_KERNELS_H
#define ORCHARD_KERNELS_H

#include <stdbool.h>

/// Single-precision matrix-multiply kernels for x86-64 CPUs with AVX2 and FMA (and, beside them, with AVX-512F), compiled per function for that
/// instruction set (no build flags needed) and called only after `orchard_avx2_available()` said yes.
/// Matrices are row-major; every kernel computes `C = alpha · op(A) · op(B) + beta · C` and never reads C when
/// `beta` is 0. On other architectures the kernels are absent and `orchard_avx2_available()` returns false.

#ifdef __cplusplus
extern "C" {
#endif

/// Whether this build has the AVX2 kernels and the CPU (and operating system) can run them.
bool orchard_avx2_available(void);

/// `C[m × n] = alpha · A · Bᵀ + beta · C`, A stored `m × k` (row stride `lda`), B stored `n × k` (row stride
/// `ldb`): every entry is a dot product of two contiguous rows.
void orchard_avx2_sgemm_nt(long m, long n, long k, float alpha,
                           const float *a, long lda, const float *b, long ldb,
                           float beta, float *c, long ldc);

/// `C[m × n] = alpha · op(A) · B + beta · C` with B stored `k × n` (row stride `ldb`); op(A) is A stored `m × k`,
/// or Aᵀ with A stored `k × m` when `transpose_a` is true (row stride `lda` either way).
void orchard_avx2_sgemm_xn(bool transpose_a, long m, long n, long k, float alpha,
                           const float *a, long lda, const float *b, long ldb,
                           float beta, float *c, long ldc);

/// Whether this build has the AVX-512 kernels and the CPU (and operating system) can run them.
bool orchard_avx512_available(void);

/// Whether the CPU has the AVX-512 subsets Intel's Skylake-SP introduced together (F, CD, BW, DQ, VL) and the operating
/// system saves their state: what OpenBLAS's SkylakeX kernels need.
bool orchard_avx512_skylake_subsets_available(void);

/// ``orchard_avx2_sgemm_nt`` on 16-wide AVX-512F vectors.
void orchard_avx512_sgemm_nt(long m, long n, long k, float alpha,
                             const float *a, long lda, const float *b, long ldb,
                             float beta, float *c, long ldc);

/// ``orchard_avx2_sgemm_xn`` on 16-wide AVX-512F vectors.
void orchard_avx512_sgemm_xn(bool transpose_a, long m, long n, long k, float alpha,
                             const float *a, long lda, const float *b, long ldb,
                             float beta, float *c, long ldc);

/// One LSTM step's element-wise forward work over `rows` rows, on AVX2 and FMA. Each row of `gates` (row stride
/// `gate_stride`) holds the step's gate pre-activations in PyTorch's order, i, f, g, o (CIFG: i, g, o, with f = 1 − i),
/// each `hidden` wide; they are replaced by their activations (sigmoid, tanh for g). The cell c = f ⊙ c₋₁ + i ⊙ g goes
/// to `cell` and the hidden state o ⊙ tanh(c) to `state` (both `rows × hidden`); `cell_previous` NULL means c₋₁ = 0.
void orchard_avx2_lstm_forward(bool cifg, long rows, long hidden, float *gates, long gate_stride,
                               const float *cell_previous, float *cell, float *state);

/// One LSTM step's element-wise backward work, on AVX2 and FMA: from the activations `gates`, the cell `cell` and
/// `cell_previous` (NULL: zero) of the forward step, the gradient reaching the hidden state (`dh_next` plus, unless
/// NULL, `dy` with row stride `dy_stride`) and the one reaching the cell from the next step (`dc`, replaced by the one
/// reaching c₋₁), writes the gate pre-activations' gradients to `dgates` (laid out as `gates`).
void orchard_avx2_lstm_backward(bool cifg, long rows, long hidden, const float *gates, long gate_stride,
                                const float *cell, const float *cell_previous, const float *dh_next, const float *dy,
                                long dy_stride, float *dc, float *dgates);

/// ``orchard_avx2_lstm_forward`` on 16-wide AVX-512F vectors.
void orchard_avx512_lstm_forward(bool cifg, long rows, long hidden, float *gates, long gate_stride,
                                 const float *cell_previous, float *cell, float *state);

/// ``orchard_avx2_lstm_backward`` on 16-wide AVX-512F vectors.
void orchard_avx512_lstm_backward(bool cifg, long rows, long hidden, const float *gates, long gate_stride,
                                  const float *cell, const float *cell_previous, const float *dh_next, const float *dy,
                                  long dy_stride, float *dc, float *dgates);

#ifdef __cplusplus
}
#endif

#endif
