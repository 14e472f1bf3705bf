// SwiGLU of a bf16 MLP on a CPU: silu(gate) * up over the fused gate_up GEMM's output
// [T, 2I] (gate columns first), in float32 with one rounding to the bf16 output, as the
// compiled graph's fused kernel computes it -- but with a lean exponential (lean_exp.h) and a
// Newton-refined reciprocal in place of its accurate exp and a division: Inductor's kernel
// took ~3 ms a prefill_15 layer on Zen 4, about 1.4 G elements/s on two cores, while the silu
// outputs are rounded to bf16 (8 bits) anyway. (With ATen's exp_u20 in place of lean_exp.h's:
// 1.24 -> 0.85-0.89 ms at prefill_15's [1,440, 6,144] on a Xeon with AMX.)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include "lean_exp.h"
#include "quantise_row.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

namespace {

using at::BFloat16;

#define SWIGLU_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

SWIGLU_TARGET inline __m512 widen(__m256i h) {  // 16 bf16 -> float32, exactly
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// exp(-g) by lean_exp.h's 2^t (a third of ATen's exp_u20's instructions; the sigmoid is rounded to bf16)
SWIGLU_TARGET inline __m512 exp_neg(__m512 g) { return bounded::exp2_lean(_mm512_mul_ps(g, _mm512_set1_ps(-bounded::LOG2E))); }

// silu(g) * u = g * u / (1 + exp(-g)); 1/d by rcp14 and one Newton step (error ~2^-28)
SWIGLU_TARGET inline __m256i swiglu16(__m256i g16, __m256i u16) {
  const __m512 g = widen(g16), u = widen(u16), one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
  const __m512 d = _mm512_add_ps(exp_neg(g), one);
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, two));
  // below -80, exp(-g) nears float32's end (inf * 0 in the Newton step): silu is 0 to float precision
  r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(g, _mm512_set1_ps(-80.0f), _CMP_GE_OQ), r);
  return (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_mul_ps(g, r), u));
}

SWIGLU_TARGET void swiglu_row(const BFloat16* gate, const BFloat16* up, BFloat16* out, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256i y = swiglu16(_mm256_loadu_si256((const __m256i*)(gate + j)), _mm256_loadu_si256((const __m256i*)(up + j)));
    _mm256_storeu_si256((__m256i*)(out + j), y);
  }
  if (j < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m256i y = swiglu16(_mm256_maskz_loadu_epi16(m, gate + j), _mm256_maskz_loadu_epi16(m, up + j));
    _mm256_mask_storeu_epi16(out + j, m, y);
  }
}

// gate_up [T, 2I] bf16 (unit column stride, any row stride) -> [T, I] bf16
at::Tensor swiglu_bf16(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.scalar_type() == at::kBFloat16 && gate_up.dim() == 2 &&
                  gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "swiglu_bf16: gate_up must be a bfloat16 CPU [T, 2I] tensor with unit column stride");
  TORCH_CHECK(__builtin_cpu_supports("avx512bf16"), "swiglu_bf16: this CPU has no AVX512-BF16");
  const int64_t t = gate_up.size(0), n = gate_up.size(1) / 2, ld = gate_up.stride(0);
  at::Tensor out = at::empty({t, n}, gate_up.options());
  const BFloat16* src = gate_up.data_ptr<BFloat16>();
  BFloat16* dst = out.data_ptr<BFloat16>();
  // rows per task: at least ~32K elements, so a small call stays on one thread
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1));
  at::parallel_for(0, t, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) swiglu_row(src + r * ld, src + r * ld + n, dst + r * n, n);
  });
  return out;
}

// The int8 MLP's middle in one pass (kernels/int8.py, model/layers.GatedMLP): gate_up's
// product as its int8 kernel writes it (bf16, without the tokens' scales) times each row's
// scale, SwiGLU in float32, and the result quantised per row for down's int8 kernel (u8
// holding q + 128, q = round(s / scale) in [-127, 127], scale = max|s| / 127). Three passes
// of the compiled graph (the scaling to bf16, the SwiGLU, the quantisation) wrote and read
// back [T, 2I] and [T, I] bf16 between them: ~3.9 ms a prefill_15 layer on a Xeon with AMX.
constexpr int64_t MAX_INNER = 16384;  // a row's SwiGLU values stay on the stack between the passes

SWIGLU_TARGET float swiglu_row_scaled(const BFloat16* gate, const BFloat16* up, float scale, float* out, int64_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  __m512 amax = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 g = _mm512_mul_ps(widen(_mm256_maskz_loadu_epi16(m, gate + j)), s);
    const __m512 u = _mm512_mul_ps(widen(_mm256_maskz_loadu_epi16(m, up + j)), s);
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    const __m512 d = _mm512_add_ps(exp_neg(g), one);
    __m512 r = _mm512_rcp14_ps(d);
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, two));
    r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(g, _mm512_set1_ps(-80.0f), _CMP_GE_OQ), r);
    const __m512 y = _mm512_maskz_mov_ps(m, _mm512_mul_ps(_mm512_mul_ps(g, r), u));
    _mm512_mask_storeu_ps(out + j, m, y);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(y));
  }
  return _mm512_reduce_max_ps(amax);
}


// product [T, 2I] bf16 (unit column stride), scale [T, 1] float32 -> (u8 [T, I], float32 [T, 1])
std::tuple<at::Tensor, at::Tensor> swiglu_quant_bf16(const at::Tensor& product, const at::Tensor& scale) {
  TORCH_CHECK(product.device().is_cpu() && product.scalar_type() == at::kBFloat16 && product.dim() == 2 &&
                  product.stride(1) == 1 && product.size(1) % 2 == 0,
              "swiglu_quant_bf16: product must be a bfloat16 CPU [T, 2I] tensor with unit column stride");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == product.size(0),
              "swiglu_quant_bf16: scale must be float32 with one value per row");
  TORCH_CHECK(product.size(1) / 2 <= MAX_INNER, "swiglu_quant_bf16: at most ", MAX_INNER, " outputs a row");
  TORCH_CHECK(__builtin_cpu_supports("avx512bf16"), "swiglu_quant_bf16: this CPU has no AVX512-BF16");
  const int64_t t = product.size(0), n = product.size(1) / 2, ld = product.stride(0);
  const at::Tensor sc = scale.contiguous();
  at::Tensor q = at::empty({t, n}, product.options().dtype(at::kByte));
  at::Tensor qs = at::empty({t, 1}, product.options().dtype(at::kFloat));
  const BFloat16* src = product.data_ptr<BFloat16>();
  const float* in_scale = sc.data_ptr<float>();
  uint8_t* dst = q.data_ptr<uint8_t>();
  float* out_scale = qs.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1));
  at::parallel_for(0, t, grain, [&](int64_t r0, int64_t r1) {
    alignas(64) float y[MAX_INNER];
    for (int64_t r = r0; r < r1; ++r) {
      const float amax = swiglu_row_scaled(src + r * ld, src + r * ld + n, in_scale[r], y, n);
      const float s = bounded::row_scale(amax);
      out_scale[r] = s;
      bounded::quantise_row(y, s, dst + r * n, n);
    }
  });
  return {q, qs};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bounded_native, m) {
  m.def("swiglu_bf16(Tensor gate_up) -> Tensor");
  m.def("swiglu_quant_bf16(Tensor product, Tensor scale) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bounded_native, CPU, m) {
  m.impl("swiglu_bf16", &swiglu_bf16);
  m.impl("swiglu_quant_bf16", &swiglu_quant_bf16);
}
