// A row of float32 values quantised for oneDNN's int8 linear (kernels/int8.quantise_rows'
// form: u8 holding q + 128, q = round(y / scale) in [-127, 127], scale = max|y| / 127), for
// the bf16 library's passes that end in an int8 GEMM's input (swiglu.cpp, norms.cpp).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace bounded {

inline float row_scale(float amax) { return std::max(amax, 1e-12f) / 127.0f; }  // as int8.quantise_rows

// y [n] (readable to the next multiple of 16) -> out [n]. q = round(y / scale) to nearest
// even, as torch.round; the product by 1/scale may land an ulp from the quotient: a value at a
// half step rounds to either neighbour
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void quantise_row(const float* y, float scale,
                                                                               uint8_t* out, int64_t n) {
  const __m512 inv = _mm512_set1_ps(1.0f / scale), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512i zero = _mm512_set1_epi32(128);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 q = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(y + j), inv),
                                                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                                 lo), hi);
    _mm_mask_storeu_epi8(out + j, m, _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(q), zero)));
  }
}

}  // namespace bounded
