// SwiGLU of a float32 MLP on a CPU with AVX2 and FMA: silu(gate) * up over the fused gate_up
// GEMM's output [T, 2I] (gate columns first). The compiled graph's fused kernel is bound by
// its accurate exponential (~20 cycles a vector: a beam_short step's [100, 2 x 4864] took
// ~0.4 ms on two Zen 3 cores, ~30 ms a request); here ATen's fast exponential (exp_u20, the
// one its flash attention uses; a few ulp) and one division, as g * u / (1 + exp(-g)); on a
// CPU with AVX-512, 16 lanes at a time with lean_exp.h's exponential.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>

#include "lean_exp.h"

namespace {

using Vec = at::vec::Vectorized<float>;

constexpr float LOG2E_LO = 1.925962989e-08f;  // log2(e) - float(log2(e))

inline __m256 swiglu8(__m256 g, __m256 u) {
  const __m256 d = _mm256_add_ps(Vec(_mm256_sub_ps(_mm256_setzero_ps(), g)).exp_u20(), _mm256_set1_ps(1.0f));
  // below -80, exp(-g) overflows to inf: g * u / inf is -0 or nan (inf u); silu is 0 there to float precision
  const __m256 y = _mm256_div_ps(_mm256_mul_ps(g, u), d);
  return _mm256_and_ps(y, _mm256_cmp_ps(g, _mm256_set1_ps(-80.0f), _CMP_GE_OQ));
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The 512-bit form where the library is built for AVX-512 (native.py): exp(-g) as 2^t with
// t = -g log2(e) from lean_exp.h's 2^t, the product's rounding error (an FMA recovers it)
// and log2(e)'s own folded back in as 2^t = 2^t_hi (1 + ln2 t_lo): without them |t| up to
// ~30 would cost ~1.5e-6 of relative error, most of the few-ulp budget.
inline __m512 swiglu16(__m512 g, __m512 u) {
  const __m512 c = _mm512_set1_ps(-bounded::LOG2E);
  const __m512 t = _mm512_mul_ps(g, c);
  const __m512 lo = _mm512_fmadd_ps(g, _mm512_set1_ps(-LOG2E_LO), _mm512_fmsub_ps(g, c, t));
  const __m512 hi = bounded::exp2_lean(t);
  const __m512 e = _mm512_fmadd_ps(hi, _mm512_mul_ps(lo, _mm512_set1_ps(0.6931471805599453f)), hi);
  const __m512 y = _mm512_div_ps(_mm512_mul_ps(g, u), _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
  // below -80, exp(-g) is inf (or the compensation's inf x 0, nan): silu is 0 there to float precision
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(g, _mm512_set1_ps(-80.0f), _CMP_GE_OQ), y);
}

void swiglu_row(const float* gate, const float* up, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(out + j, swiglu16(_mm512_loadu_ps(gate + j), _mm512_loadu_ps(up + j)));
  if (j < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(out + j, m, swiglu16(_mm512_maskz_loadu_ps(m, gate + j), _mm512_maskz_loadu_ps(m, up + j)));
  }
}
#else
void swiglu_row(const float* gate, const float* up, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(out + j, swiglu8(_mm256_loadu_ps(gate + j), _mm256_loadu_ps(up + j)));
  if (j < n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - j)), lane);
    _mm256_maskstore_ps(out + j, m, swiglu8(_mm256_maskload_ps(gate + j, m), _mm256_maskload_ps(up + j, m)));
  }
}
#endif

// gate_up [T, 2I] float32 (unit column stride, any row stride) -> [T, I] float32
at::Tensor swiglu_f32(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.scalar_type() == at::kFloat && gate_up.dim() == 2 &&
                  gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "swiglu_f32: gate_up must be a float32 CPU [T, 2I] tensor with unit column stride");
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "swiglu_f32: this CPU has no AVX2 and FMA");
  const int64_t t = gate_up.size(0), n = gate_up.size(1) / 2, ld = gate_up.stride(0);
  at::Tensor out = at::empty({t, n}, gate_up.options());
  const float* src = gate_up.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  // rows per task: at least ~32K elements, so a small call stays on one thread
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1));
  at::parallel_for(0, t, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) swiglu_row(src + r * ld, src + r * ld + n, dst + r * n, n);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bounded_native_f32, m) { m.def("swiglu_f32(Tensor gate_up) -> Tensor"); }

TORCH_LIBRARY_IMPL(bounded_native_f32, CPU, m) { m.impl("swiglu_f32", &swiglu_f32); }
