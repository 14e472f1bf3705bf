// The float32 building blocks of the native attentions (varlen_attention_f32.cpp for the
// packed prefill, beam_attention_f32.cpp for a beam decode step): a register-tiled GEMM
// micro-kernel (6 rows x 16 columns, FMA; 32 on AVX-512), an exponentiated softmax row, an 8 x 8 transpose.
// AVX2 + FMA; the including file is built with -mavx2 -mfma (native.py), and with -mavx512f
// -mavx512dq on a CPU that has them, where the GEMM takes 32-column panels on 512-bit
// registers and a softmax row's exponentials are lean_exp.h's, 16 lanes at a time.
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include "head_summary.h"  // lanes: a vector's mask at a row's end
#include "lean_exp.h"
#endif

namespace bounded::f32 {

using Vec = at::vec::Vectorized<float>;

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

inline float hsum(__m256 v) {
  const __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 y = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
}

// c[R, 16] (ldc) = a[R, kdim] (rows lda apart) x b[kdim, 16] (rows ldb apart). Columns past
// the caller's width are computed from b's padding and never read. The accumulators are named
// registers, not an array: gcc kept an array of them on the stack, storing all twelve at every
// step (a store-bound loop at a quarter of the FMA rate).
template <int R>
inline void micro(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t p = 0; p < kdim; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b + p * ldb), b1 = _mm256_loadu_ps(b + p * ldb + 8);
#define BOUNDED_ROW(r)                                                \
    if constexpr (R > r) {                                            \
      const __m256 x = _mm256_broadcast_ss(a + r * lda + p);          \
      c##r##0 = _mm256_fmadd_ps(x, b0, c##r##0);                      \
      c##r##1 = _mm256_fmadd_ps(x, b1, c##r##1);                      \
    }
    BOUNDED_ROW(0) BOUNDED_ROW(1) BOUNDED_ROW(2) BOUNDED_ROW(3) BOUNDED_ROW(4) BOUNDED_ROW(5)
#undef BOUNDED_ROW
  }
#define BOUNDED_STORE(r)                                              \
  if constexpr (R > r) {                                              \
    _mm256_storeu_ps(c + r * ldc, c##r##0);                           \
    _mm256_storeu_ps(c + r * ldc + 8, c##r##1);                       \
  }
  BOUNDED_STORE(0) BOUNDED_STORE(1) BOUNDED_STORE(2) BOUNDED_STORE(3) BOUNDED_STORE(4) BOUNDED_STORE(5)
#undef BOUNDED_STORE
}

using Micro = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

constexpr int64_t MR = 6;  // rows per micro-kernel call: 12 accumulators + 2 of b + 1 broadcast of 16 registers

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// micro's 32-column form where the library is built for AVX-512 (native.py, on a CPU with
// avx512f): the same 6 rows on 512-bit registers, twice the columns per FMA (Ice Lake, a
// Sapphire Rapids whose AMX is hidden, Zen 4's float32 hold-out plans). Columns 0-15 come
// from b0's rows, 16-31 from b1's (two halves of one row, or two packed panels of the beam
// head). Each output is the same chain of FMAs over k as micro's: the results are equal bit
// for bit.
template <int R>
inline void micro_pair(const float* a, int64_t lda, const float* b0, const float* b1, int64_t ldb, int64_t kdim,
                       float* c, int64_t ldc) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t p = 0; p < kdim; ++p) {
    const __m512 lo = _mm512_loadu_ps(b0 + p * ldb), hi = _mm512_loadu_ps(b1 + p * ldb);
#define BOUNDED_ROW(r)                                                \
    if constexpr (R > r) {                                            \
      const __m512 x = _mm512_set1_ps(a[r * lda + p]);                \
      c##r##0 = _mm512_fmadd_ps(x, lo, c##r##0);                      \
      c##r##1 = _mm512_fmadd_ps(x, hi, c##r##1);                      \
    }
    BOUNDED_ROW(0) BOUNDED_ROW(1) BOUNDED_ROW(2) BOUNDED_ROW(3) BOUNDED_ROW(4) BOUNDED_ROW(5)
#undef BOUNDED_ROW
  }
#define BOUNDED_STORE(r)                                              \
  if constexpr (R > r) {                                              \
    _mm512_storeu_ps(c + r * ldc, c##r##0);                           \
    _mm512_storeu_ps(c + r * ldc + 16, c##r##1);                      \
  }
  BOUNDED_STORE(0) BOUNDED_STORE(1) BOUNDED_STORE(2) BOUNDED_STORE(3) BOUNDED_STORE(4) BOUNDED_STORE(5)
#undef BOUNDED_STORE
}

template <int R>
inline void micro32(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc) {
  micro_pair<R>(a, lda, b, b + 16, ldb, kdim, c, ldc);
}
#endif

// c[m, n rounded up to 16] = a[m, kdim] x b[kdim, n]; b's and c's rows hold at least n
// rounded up to 16 floats. A panel of b (32 or 16 columns) stays in L1 across the rows.
inline void gemm(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t kdim, int64_t n, float* c,
          int64_t ldc) {
  static constexpr std::array<Micro, MR> table = {&micro<1>, &micro<2>, &micro<3>, &micro<4>, &micro<5>, &micro<6>};
  int64_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  static constexpr std::array<Micro, MR> wide = {&micro32<1>, &micro32<2>, &micro32<3>,
                                                 &micro32<4>, &micro32<5>, &micro32<6>};
  for (; j + 32 <= round_up(n, 16); j += 32) {
    for (int64_t i = 0; i < m; i += MR) wide[std::min<int64_t>(MR, m - i) - 1](a + i * lda, lda, b + j, ldb, kdim,
                                                                               c + i * ldc + j, ldc);
  }
#endif
  for (; j < n; j += 16) {
    for (int64_t i = 0; i < m; i += MR) table[std::min<int64_t>(MR, m - i) - 1](a + i * lda, lda, b + j, ldb, kdim,
                                                                                c + i * ldc + j, ldc);
  }
}

inline __m256 lanes_below(int64_t k) {  // lanes 0..k-1 set (k < 8)
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(k)), _CMP_LT_OQ);
}

// The largest of row[0:n] and `at_least` (keys a caller scored elsewhere).
inline float row_max(const float* row, int64_t n, float at_least = -std::numeric_limits<float>::infinity()) {
  __m256 vmax = _mm256_set1_ps(at_least);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(row + j));
  if (j < n) vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(vmax, _mm256_loadu_ps(row + j), lanes_below(n - j)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

// row[0:n] = exp(row * scale - mx * scale) in place, zero from n up to `width` (a multiple of
// 8); returns their sum. Whole vectors, the last one's lanes past n zeroed by a mask: a row
// of a short sequence is mostly its tail.
inline float exp_row_at(float* row, int64_t n, float scale, int64_t width, float mx) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  // 16 lanes, lean_exp.h's 2^t of t = (x - mx) * scale * log2(e) in one FMA; the loads and
  // stores masked at n, so no caller's row needs room past it
  const __m512 a = _mm512_set1_ps(scale * LOG2E), b = _mm512_set1_ps(-mx * scale * LOG2E);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = bounded::summary::lanes(j, n);
    const __m512 e = _mm512_maskz_mov_ps(m, exp2_lean(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, row + j), a, b)));
    _mm512_mask_storeu_ps(row + j, m, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (n < width) std::fill(row + n, row + width, 0.0f);
  return _mm512_reduce_add_ps(vsum);
#else
  const Vec vscale(scale), vshift(mx * scale);
  __m256 vsum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j < n; j += 8) {
    __m256 e = (Vec::loadu(row + j) * vscale - vshift).exp_u20();
    if (j + 8 > n) e = _mm256_and_ps(e, lanes_below(n - j));
    _mm256_storeu_ps(row + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  std::fill(row + j, row + width, 0.0f);
  return hsum(vsum);
#endif
}

// row[0:n] *= s
inline void scale_row(float* row, int64_t n, float s) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  const __m512 v = _mm512_set1_ps(s);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = bounded::summary::lanes(j, n);
    _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), v));
  }
#else
  const Vec v(s);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) (Vec::loadu(row + j) * v).store(row + j);
  for (; j < n; ++j) row[j] *= s;
#endif
}

// exp_row_at at the row's own maximum: a softmax row's exponentials and their sum.
inline float exp_row(float* row, int64_t n, float scale, int64_t width) {
  return exp_row_at(row, n, scale, width, row_max(row, n));
}

// dst[i * ldd + l] = rows[l][c + i] for i, l < 8: an 8 x 8 block of floats transposed in registers.
inline void transpose8(const float* const* rows, int64_t c, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int l = 0; l < 8; ++l) r[l] = _mm256_loadu_ps(rows[l] + c);
  for (int l = 0; l < 8; l += 2) {
    t[l] = _mm256_unpacklo_ps(r[l], r[l + 1]);
    t[l + 1] = _mm256_unpackhi_ps(r[l], r[l + 1]);
  }
  for (int l = 0; l < 8; l += 4) {
    r[l] = _mm256_shuffle_ps(t[l], t[l + 2], 0x44);
    r[l + 1] = _mm256_shuffle_ps(t[l], t[l + 2], 0xEE);
    r[l + 2] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0x44);
    r[l + 3] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0xEE);
  }
  for (int l = 0; l < 4; ++l) {
    _mm256_storeu_ps(dst + l * ldd, _mm256_permute2f128_ps(r[l], r[l + 4], 0x20));
    _mm256_storeu_ps(dst + (l + 4) * ldd, _mm256_permute2f128_ps(r[l], r[l + 4], 0x31));
  }
}

}  // namespace bounded::f32
