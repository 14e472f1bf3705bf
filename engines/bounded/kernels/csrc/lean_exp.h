// A lean exponential for the bf16 library's epilogues (beam_head.cpp's log-sum-exp,
// swiglu.cpp's sigmoid), whose results are summed in float32 or rounded to bf16.
#pragma once

#include <immintrin.h>

namespace bounded {

constexpr float LOG2E = 1.4426950408889634f;

// 2^t: 2^floor(t) x 2^f, f = t - floor(t) in [0, 1) (vreduceps), 2^f by a degree-5 polynomial
// (Chebyshev fit, relative error <= 1.8e-7 in float32; ATen's exp_u20: ~1.2e-6), 2^floor(t) by
// scalef, which takes any exponent: t past float32's range gives inf or 0, as exp would. A
// third of exp_u20's instructions (no clamping, no integer exponent arithmetic).
__attribute__((target("avx512f,avx512dq"))) inline __m512 exp2_lean(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_fmadd_ps(f, _mm512_set1_ps(0.0018951073288917542f), _mm512_set1_ps(0.00894621480256319f));
  p = _mm512_fmadd_ps(f, p, _mm512_set1_ps(0.055863283574581146f));
  p = _mm512_fmadd_ps(f, p, _mm512_set1_ps(0.24014076590538025f));
  p = _mm512_fmadd_ps(f, p, _mm512_set1_ps(0.6931546330451965f));
  p = _mm512_fmadd_ps(f, p, _mm512_set1_ps(0.9999998807907104f));
  return _mm512_scalef_ps(p, t);
}

}  // namespace bounded
