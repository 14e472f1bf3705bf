// The residual add and the RMSNorm after it, in one pass over each row, for bf16 plans on a
// CPU with AVX512-BF16 (model/decoder.DecoderModel, the packed prefill's layer loop): the
// float32 residual stream x plus a GEMM's bf16 output (an int8 GEMM's product times its rows'
// scales, rounded to bf16, where a scale is given), the new stream written once, and its norm
// written as bf16 (`add_rms_norm_bf16`) or quantised per row for an int8 GEMM
// (`add_rms_norm_quant_bf16`: u8 holding q + 128, as kernels/int8.quantise_rows); and that
// quantisation alone (`quantise_rows_bf16`, the attention's output for the o GEMM).
// The same roundings as the graph's form (kernels/norms.py): only the order of the sum of
// squares differs. Inductor's fused kernels for these ran at 0.74 / 1.14 / 0.90 ms on a
// prefill_15-sized call ([1,440, 1,024], [1,440, 2,048]) on a Xeon with AMX, well under the
// copy bandwidth of their bytes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include "quantise_row.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

namespace {

using at::BFloat16;
using bounded::quantise_row;
using bounded::row_scale;

#define NORMS_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

constexpr int64_t MAX_HIDDEN = 16384;  // a row's normed values stay on the stack between the passes

NORMS_TARGET inline __m512 widen(__m256i h) {  // 16 bf16 -> float32, exactly
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

NORMS_TARGET inline __m512 round_bf16(__m512 x) {  // to the nearest bf16 (even on ties), as float32
  return widen((__m256i)_mm512_cvtneps_pbh(x));
}

NORMS_TARGET inline __mmask16 tail(int64_t n, int64_t j) {
  return n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
}

// x_new = x + d (d = bf16(delta * scale) where scaled, else delta) -> x_new's sum of squares
NORMS_TARGET float add_row(const float* x, const BFloat16* delta, const float* scale, float* out, int64_t n) {
  __m512 ss = _mm512_setzero_ps();
  const __m512 s = _mm512_set1_ps(scale ? *scale : 1.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail(n, j);
    __m512 d = widen(_mm256_maskz_loadu_epi16(m, delta + j));
    if (scale) d = round_bf16(_mm512_mul_ps(d, s));
    const __m512 y = _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + j), d);
    _mm512_mask_storeu_ps(out + j, m, y);
    ss = _mm512_fmadd_ps(y, y, ss);
  }
  return _mm512_reduce_add_ps(ss);
}

// h = w * bf16(x * inv), rounded to bf16: into `hb` as bf16, or into `h` as float32 -> then max |h| (0 with hb)
NORMS_TARGET float norm_row(const float* x, const BFloat16* w, float inv, float* h, BFloat16* hb, int64_t n) {
  const __m512 r = _mm512_set1_ps(inv);
  __m512 amax = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail(n, j);
    const __m512 y = round_bf16(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), r));
    const __m512 v = _mm512_mul_ps(widen(_mm256_maskz_loadu_epi16(m, w + j)), y);
    if (hb) {
      _mm256_mask_storeu_epi16(hb + j, m, (__m256i)_mm512_cvtneps_pbh(v));
    } else {
      const __m512 hv = round_bf16(v);
      _mm512_mask_storeu_ps(h + j, m, hv);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(hv));
    }
  }
  return _mm512_reduce_max_ps(amax);
}


void check_add_norm(const char* op, const at::Tensor& x, const at::Tensor& delta,
                    const std::optional<at::Tensor>& delta_scale, const at::Tensor& weight) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), op,
              ": x must be a contiguous float32 CPU [T, H] tensor");
  TORCH_CHECK(delta.scalar_type() == at::kBFloat16 && delta.sizes() == x.sizes() && delta.stride(1) == 1, op,
              ": delta must be bfloat16 [T, H] with unit column stride");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.dim() == 1 && weight.size(0) == x.size(1) &&
                  weight.is_contiguous(),
              op, ": weight must be a contiguous bfloat16 [H]");
  TORCH_CHECK(!delta_scale || (delta_scale->scalar_type() == at::kFloat && delta_scale->numel() == x.size(0) &&
                               delta_scale->is_contiguous()),
              op, ": delta_scale must be contiguous float32 with one value per row");
  TORCH_CHECK(x.size(1) <= MAX_HIDDEN, op, ": at most ", MAX_HIDDEN, " values a row");
  TORCH_CHECK(__builtin_cpu_supports("avx512bf16"), op, ": this CPU has no AVX512-BF16");
}

int64_t grain_for(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

// Both entries' rows: x + delta into out, and its norm into hb (bf16) or, with hb null, quantised
// into q and qs (the row scales). x [T, H] float32, delta [T, H] bf16, delta_scale [T, 1]
// float32 or None, weight [H] bf16 (checked by check_add_norm).
void add_norm_rows(const at::Tensor& x, const at::Tensor& delta, const std::optional<at::Tensor>& delta_scale,
                   const at::Tensor& weight, double eps, float* out, BFloat16* hb, uint8_t* q, float* qs) {
  const int64_t t = x.size(0), n = x.size(1), ld = delta.stride(0);
  const float* xs = x.data_ptr<float>();
  const BFloat16* ds = delta.data_ptr<BFloat16>();
  const float* sc = delta_scale ? delta_scale->data_ptr<float>() : nullptr;
  const BFloat16* w = weight.data_ptr<BFloat16>();
  at::parallel_for(0, t, grain_for(n), [&](int64_t r0, int64_t r1) {
    alignas(64) float h[MAX_HIDDEN];
    for (int64_t r = r0; r < r1; ++r) {
      const float ss = add_row(xs + r * n, ds + r * ld, sc ? sc + r : nullptr, out + r * n, n);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
      if (hb != nullptr) {
        norm_row(out + r * n, w, inv, nullptr, hb + r * n, n);
      } else {
        qs[r] = row_scale(norm_row(out + r * n, w, inv, h, nullptr, n));
        quantise_row(h, qs[r], q + r * n, n);
      }
    }
  });
}

// -> (x + delta [T, H] float32, rms_norm(x + delta) * weight [T, H] bf16)
std::tuple<at::Tensor, at::Tensor> add_rms_norm_bf16(const at::Tensor& x, const at::Tensor& delta,
                                                     const std::optional<at::Tensor>& delta_scale,
                                                     const at::Tensor& weight, double eps) {
  check_add_norm("add_rms_norm_bf16", x, delta, delta_scale, weight);
  at::Tensor out = at::empty_like(x), h = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  add_norm_rows(x, delta, delta_scale, weight, eps, out.data_ptr<float>(), h.data_ptr<BFloat16>(), nullptr, nullptr);
  return {out, h};
}

// as add_rms_norm_bf16, the norm quantised per row -> (x + delta, u8 [T, H], float32 scale [T, 1])
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_quant_bf16(const at::Tensor& x, const at::Tensor& delta,
                                                                       const std::optional<at::Tensor>& delta_scale,
                                                                       const at::Tensor& weight, double eps) {
  check_add_norm("add_rms_norm_quant_bf16", x, delta, delta_scale, weight);
  at::Tensor out = at::empty_like(x), q = at::empty(x.sizes(), x.options().dtype(at::kByte));
  at::Tensor qs = at::empty({x.size(0), 1}, x.options());
  add_norm_rows(x, delta, delta_scale, weight, eps, out.data_ptr<float>(), nullptr, q.data_ptr<uint8_t>(),
                qs.data_ptr<float>());
  return {out, q, qs};
}

// x [T, K] bf16 (unit column stride) -> (u8 [T, K] holding q + 128, float32 scale [T, 1])
std::tuple<at::Tensor, at::Tensor> quantise_rows_bf16(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.stride(1) == 1,
              "quantise_rows_bf16: x must be a bfloat16 CPU [T, K] tensor with unit column stride");
  TORCH_CHECK(x.size(1) <= MAX_HIDDEN, "quantise_rows_bf16: at most ", MAX_HIDDEN, " values a row");
  TORCH_CHECK(__builtin_cpu_supports("avx512bf16"), "quantise_rows_bf16: this CPU has no AVX512-BF16");
  const int64_t t = x.size(0), n = x.size(1), ld = x.stride(0);
  at::Tensor q = at::empty({t, n}, x.options().dtype(at::kByte)), qs = at::empty({t, 1}, x.options().dtype(at::kFloat));
  const BFloat16* xs = x.data_ptr<BFloat16>();
  uint8_t* qd = q.data_ptr<uint8_t>();
  float* qsd = qs.data_ptr<float>();
  at::parallel_for(0, t, grain_for(n), [&](int64_t r0, int64_t r1) {
    alignas(64) float y[MAX_HIDDEN];
    for (int64_t r = r0; r < r1; ++r) {
      __m512 amax = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; j += 16) {
        const __m512 v = widen(_mm256_maskz_loadu_epi16(tail(n, j), xs + r * ld + j));
        _mm512_storeu_ps(y + j, v);
        amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      }
      const float s = row_scale(_mm512_reduce_max_ps(amax));
      qsd[r] = s;
      quantise_row(y, s, qd + r * n, n);
    }
  });
  return {q, qs};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bounded_native, m) {
  m.def("add_rms_norm_bf16(Tensor x, Tensor delta, Tensor? delta_scale, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("add_rms_norm_quant_bf16(Tensor x, Tensor delta, Tensor? delta_scale, Tensor weight, float eps) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("quantise_rows_bf16(Tensor x) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bounded_native, CPU, m) {
  m.impl("add_rms_norm_bf16", &add_rms_norm_bf16);
  m.impl("add_rms_norm_quant_bf16", &add_rms_norm_quant_bf16);
  m.impl("quantise_rows_bf16", &quantise_rows_bf16);
}
