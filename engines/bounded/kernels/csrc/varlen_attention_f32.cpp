// Causal attention within each sequence of a packed float32 prefill batch, on any x86-64 CPU
// with AVX2 and FMA: the native body of bounded::varlen_attention (kernels/attention.py) for
// the float32 plans -- what policy auto computes in on a CPU without native bf16 (Zen 3, Ice
// Lake), and the hold-out plans everywhere. One call per layer; no Python, no padding, no
// per-sequence tensor objects (the Python body made ~8 small tensor ops per sequence and
// layer, most of a short sequence's cost).
//
// The same plan as the bf16 kernel (varlen_attention.cpp): a sequence may continue an earlier
// one, its prefix (a query whose K/V its items share), and then sees every prefix key. Work is
// cut into units of (sequence, K/V head), taken largest-first from a shared counter by the
// threads of torch's pool. Per unit, K^T is packed once ([D, keys], so a score row is a run of
// contiguous columns) and V is gathered once into contiguous rows; per block of BLOCK query
// rows, whose keys stop at its last row (the upper blocks of the causal triangle are never
// computed), and per query head of the group: scores = Q K^T, scaled, masked, softmax in
// float32 (the exponentials summed as they are written, then the row divided by the sum), P V
// written where the output lies (a head dim not a multiple of 16: through a buffer, the
// division deferred to its rows). Both GEMMs run one register-tiled micro-kernel (6 rows x 16 columns, or 32 on AVX-512; FMA;
// f32_kernels.h, shared with the beam step's attention).
// A second entry, varlen_attention_rope_f32, takes the qkv projection as its GEMM gave it and
// RMS-norms (Qwen3's q/k norms) and rotates q and k itself as it reads them, like the bf16
// kernel's: the graph's separate norm + RoPE kernel wrote q and k and read them back.
// Built with -mavx2 -mfma (native.py), loaded only on CPUs with both.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <immintrin.h>

#include "f32_kernels.h"
#include "varlen_units.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

constexpr int64_t BLOCK = 32;  // query rows per block: its keys stop at its last row

using bounded::Unit;
using bounded::f32::exp_row;
using bounded::f32::gemm;
using bounded::f32::hsum;
using bounded::f32::round_up;
using bounded::f32::scale_row;
using bounded::f32::transpose8;

struct Rows {             // q/k/v [T, H, D], rows `stride` elements apart
  const float* q;
  const float* k;
  const float* v;
  int64_t qs, ks, vs;
};

struct Prep {             // the fused entry: q/k as projected, RMS-normed (weights, or none) and rotated here
  const float* cos = nullptr;  // [P, D] rotary tables (nullptr: q/k arrive ready)
  const float* sin = nullptr;
  const int64_t* pos = nullptr;  // [T] each row's position
  const float* qw = nullptr;     // [D] q/k norm weights (nullptr: no norm, as Qwen2)
  const float* kw = nullptr;
  float eps = 0.0f;
};

// dst[0:d] = rotate(norm(src)) for one head's row at position `pos`, as the graph's norm +
// RoPE computes it: x * rsqrt(mean(x^2) + eps) * w (no norm where w is nullptr), then the
// rotate-half form x * cos + (-x_hi, x_lo) * sin. d % 16 == 0, d <= 512. 16 lanes at a time
// where the library is built for AVX-512 (a half row's last vector masked where d / 2 is not
// a multiple of 16), else 8.
#if defined(__AVX512F__) && defined(__AVX512DQ__)
void prep_row(const float* src, const float* w, const Prep& p, int64_t pos, int64_t d, float* dst) {
  alignas(64) float x[512];
  const float* y = src;
  if (w != nullptr) {
    __m512 ss = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) {
      const __m512 a = _mm512_loadu_ps(src + c);
      ss = _mm512_fmadd_ps(a, a, ss);
    }
    const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(d) + p.eps));
    for (int64_t c = 0; c < d; c += 16)
      _mm512_store_ps(x + c, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(src + c), r), _mm512_loadu_ps(w + c)));
    y = x;
  }
  const int64_t h = d / 2;
  const float* cs = p.cos + pos * d;
  const float* sn = p.sin + pos * d;
  for (int64_t c = 0; c < h; c += 16) {
    const __mmask16 m = bounded::summary::lanes(c, h);
    const __m512 lo = _mm512_maskz_loadu_ps(m, y + c), hi = _mm512_maskz_loadu_ps(m, y + c + h);
    _mm512_mask_storeu_ps(dst + c, m, _mm512_fnmadd_ps(hi, _mm512_maskz_loadu_ps(m, sn + c),
                                                       _mm512_mul_ps(lo, _mm512_maskz_loadu_ps(m, cs + c))));
    _mm512_mask_storeu_ps(dst + c + h, m, _mm512_fmadd_ps(lo, _mm512_maskz_loadu_ps(m, sn + c + h),
                                                           _mm512_mul_ps(hi, _mm512_maskz_loadu_ps(m, cs + c + h))));
  }
}
#else
void prep_row(const float* src, const float* w, const Prep& p, int64_t pos, int64_t d, float* dst) {
  alignas(32) float x[512];
  const float* y = src;
  if (w != nullptr) {
    __m256 ss = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c += 8) {
      const __m256 a = _mm256_loadu_ps(src + c);
      ss = _mm256_fmadd_ps(a, a, ss);
    }
    const __m256 r = _mm256_set1_ps(1.0f / std::sqrt(hsum(ss) / static_cast<float>(d) + p.eps));
    for (int64_t c = 0; c < d; c += 8)
      _mm256_store_ps(x + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + c), r), _mm256_loadu_ps(w + c)));
    y = x;
  }
  const int64_t h = d / 2;
  const float* cs = p.cos + pos * d;
  const float* sn = p.sin + pos * d;
  for (int64_t c = 0; c < h; c += 8) {
    const __m256 lo = _mm256_loadu_ps(y + c), hi = _mm256_loadu_ps(y + c + h);
    _mm256_storeu_ps(dst + c, _mm256_fnmadd_ps(hi, _mm256_loadu_ps(sn + c), _mm256_mul_ps(lo, _mm256_loadu_ps(cs + c))));
    _mm256_storeu_ps(dst + c + h,
                     _mm256_fmadd_ps(lo, _mm256_loadu_ps(sn + c + h), _mm256_mul_ps(hi, _mm256_loadu_ps(cs + c + h))));
  }
}
#endif

// Rows of q/k/v lie a whole projection apart: the hardware prefetcher does not follow them,
// so the rows AHEAD of the one being prepared are requested early (as in the bf16 kernel).
constexpr int64_t AHEAD = 4;

inline void prefetch_row(const float* row, int64_t d) {
  for (int64_t b = 0; b < d * 4; b += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + b, _MM_HINT_T0);
}

struct Scratch {
  std::vector<float> kt, vt, scores, acc;
  std::vector<float> sums;
  std::vector<float> qp, kp;  // rows prepared by prep_row
};

void run_unit(const Unit& u, const Rows& x, const Prep& prep, float* out, int64_t hq, int64_t hkv, int64_t d,
              float scale, Scratch& w) {
  const int64_t g = hq / hkv;
  const int64_t keys = u.pre_len + (u.own1 - u.own0);
  const int64_t ldk = round_up(keys, 16), ldv = round_up(d, 16);
  auto key_row = [&](int64_t j) { return j < u.pre_len ? u.pre0 + j : u.own0 + (j - u.pre_len); };
  // once per unit: kt[c * ldk + j] = K[j][c]; vt[j * ldv + c] = V[j][c]. V's padding rows
  // zero (a block's P V runs over its width rounded up to 8 keys, whose probabilities are
  // zero: 0 x a stale inf would be nan); K's padding columns only make scores past a row's
  // keys, which exp_row overwrites
  w.kt.resize(d * ldk);
  w.vt.resize(ldk * ldv);
  std::fill(w.vt.begin() + keys * ldv, w.vt.begin() + ldk * ldv, 0.0f);
  // the keys' rows: prepared (normed + rotated) into scratch first where the entry prepares
  // them, else read where they lie
  auto k_at = [&](int64_t j) { return x.k + key_row(j) * x.ks + u.head * d; };
  const float* kbase = nullptr;  // prepared rows, d apart
  if (prep.cos != nullptr) {
    w.kp.resize(keys * d);
    for (int64_t r = 0; r < keys; ++r) {
      if (r + AHEAD < keys) prefetch_row(k_at(r + AHEAD), d);
      prep_row(k_at(r), prep.kw, prep, prep.pos[key_row(r)], d, w.kp.data() + r * d);
    }
    kbase = w.kp.data();
  }
  auto key = [&](int64_t j) { return kbase != nullptr ? kbase + j * d : k_at(j); };
  const float* krow[8];
  int64_t j = 0;
  for (; j + 8 <= keys && d % 8 == 0; j += 8) {  // 8 x 8 tiles (a column-by-column copy was 1/4 of the unit's own time)
    for (int l = 0; l < 8; ++l) krow[l] = key(j + l);
    for (int64_t c = 0; c < d; c += 8) transpose8(krow, c, w.kt.data() + c * ldk + j, ldk);
  }
  for (; j < keys; ++j) {
    const float* kr = key(j);
    for (int64_t c = 0; c < d; ++c) w.kt[c * ldk + j] = kr[c];
  }
  for (j = 0; j < keys; ++j) {
    const float* vr = x.v + key_row(j) * x.vs + u.head * d;
    std::copy(vr, vr + d, w.vt.data() + j * ldv);
  }
  const int64_t rows = std::min<int64_t>(BLOCK, u.own1 - u.own0);
  w.scores.resize(rows * ldk);
  w.acc.resize(rows * ldv);
  w.sums.resize(rows);
  if (prep.cos != nullptr) w.qp.resize(rows * d);
  for (int64_t r0 = u.own0; r0 < u.own1; r0 += BLOCK) {
    const int64_t m = std::min(BLOCK, u.own1 - r0);
    const int64_t seen = u.pre_len + (r0 + m - u.own0);  // keys up to the block's last row
    const int64_t width = round_up(seen, 8);  // <= ldk
    for (int64_t gi = 0; gi < g; ++gi) {
      const int64_t h = u.head * g + gi;
      const float* qa = x.q + r0 * x.qs + h * d;
      int64_t lda = x.qs;
      if (prep.cos != nullptr) {  // each (row, head) of q is prepared once: its block is this unit's
        for (int64_t r = 0; r < m; ++r) {
          if (r + AHEAD < m) prefetch_row(qa + (r + AHEAD) * x.qs, d);
          prep_row(qa + r * x.qs, prep.qw, prep, prep.pos[r0 + r], d, w.qp.data() + r * d);
        }
        qa = w.qp.data();
        lda = d;
      }
      gemm(qa, lda, m, w.kt.data(), ldk, d, seen, w.scores.data(), ldk);
      float* o = out + r0 * hq * d + h * d;
      if (d % 16 == 0) {  // the probabilities normalised, and P V written where the output lies
        for (int64_t r = 0; r < m; ++r) {
          const int64_t valid = u.pre_len + (r0 + r - u.own0) + 1;  // causal: keys up to this row
          float* row = w.scores.data() + r * ldk;
          scale_row(row, valid, 1.0f / exp_row(row, valid, scale, width));
        }
        gemm(w.scores.data(), ldk, m, w.vt.data(), ldv, width, d, o, hq * d);
        continue;
      }
      for (int64_t r = 0; r < m; ++r) {
        const int64_t valid = u.pre_len + (r0 + r - u.own0) + 1;
        w.sums[r] = exp_row(w.scores.data() + r * ldk, valid, scale, width);
      }
      gemm(w.scores.data(), ldk, m, w.vt.data(), ldv, width, d, w.acc.data(), ldv);
      for (int64_t r = 0; r < m; ++r) {  // a head dim gemm cannot write in place (columns past d)
        const Vec inv(1.0f / w.sums[r]);
        const float* a = w.acc.data() + r * ldv;
        float* orow = o + r * hq * d;
        int64_t c = 0;
        for (; c + Vec::size() <= d; c += Vec::size()) (Vec::loadu(a + c) * inv).store(orow + c);
        for (; c < d; ++c) orow[c] = a[c] / w.sums[r];
      }
    }
  }
}

bool supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

at::Tensor attend(const Rows& x, const Prep& prep, int64_t t, int64_t hq, int64_t hkv, int64_t d,
                  const at::Tensor& cu_seqlens, const c10::optional<at::Tensor>& prefix, const at::TensorOptions& opts) {
  const std::vector<Unit> units = bounded::varlen_units(cu_seqlens, prefix, t, hkv);
  auto out = at::empty({t, hq * d}, opts);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* op = out.data_ptr<float>();
  bounded::run_units<Scratch>(units, [&](const Unit& u, Scratch& w) { run_unit(u, x, prep, op, hq, hkv, d, scale, w); });
  return out;
}

at::Tensor varlen_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& cu_seqlens, const c10::optional<at::Tensor>& prefix) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "CPU tensors only");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "float32 q/k/v only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q/k/v: [T, H, D]");
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2), hkv = k.size(1);
  TORCH_CHECK(hkv > 0 && hq % hkv == 0 && k.size(2) == d && v.sizes() == k.sizes() && k.size(0) == t,
              "q [T, Hq, D], k/v [T, Hkv, D] with Hkv dividing Hq");
  TORCH_CHECK(supported(), "this CPU has no AVX2 and FMA");
  auto rows_of = [](const at::Tensor& x) {  // any row stride; heads and dims packed
    return x.stride(2) == 1 && x.stride(1) == x.size(2) ? x : x.contiguous();
  };
  auto qc = rows_of(q), kc = rows_of(k), vc = rows_of(v);
  const Rows x{qc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(), qc.stride(0), kc.stride(0),
               vc.stride(0)};
  return attend(x, Prep{}, t, hq, hkv, d, cu_seqlens, prefix, q.options());
}

// The same attention over the fused projection qkv [T, (Hq + 2 Hkv) D] as the qkv GEMM gives
// it: q and k RMS-normed per head (q_norm/k_norm [D], or none) and rotated at `positions` by
// the float32 tables cos/sin [P, D] here, as they are read.
at::Tensor varlen_attention_rope_f32(const at::Tensor& qkv, int64_t hq, int64_t hkv,
                                     const c10::optional<at::Tensor>& q_norm, const c10::optional<at::Tensor>& k_norm,
                                     double eps, const at::Tensor& cos, const at::Tensor& sin,
                                     const at::Tensor& positions, const at::Tensor& cu_seqlens,
                                     const c10::optional<at::Tensor>& prefix) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1,
              "qkv: a float32 CPU [T, (Hq + 2 Hkv) D] with unit column stride");
  TORCH_CHECK(hkv > 0 && hq % hkv == 0 && qkv.size(1) % (hq + 2 * hkv) == 0, "qkv: (Hq + 2 Hkv) heads, Hkv dividing Hq");
  const int64_t t = qkv.size(0), d = qkv.size(1) / (hq + 2 * hkv);
  TORCH_CHECK(d % 16 == 0 && d <= 512, "head dim a multiple of 16, at most 512");
  TORCH_CHECK(supported(), "this CPU has no AVX2 and FMA");
  auto table = [&](const at::Tensor& x, const char* name) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == d, name, ": float32 [P, D]");
    return x.contiguous();
  };
  auto cs = table(cos, "cos"), sn = table(sin, "sin");
  TORCH_CHECK(cs.size(0) == sn.size(0), "cos and sin of one length");
  auto pos = positions.to(at::kLong).contiguous();
  TORCH_CHECK(pos.numel() == t, "positions: one per row");
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i) TORCH_CHECK(pp[i] >= 0 && pp[i] < cs.size(0), "position ", pp[i], " outside the tables");
  auto weight = [&](const c10::optional<at::Tensor>& w) -> at::Tensor {
    if (!w.has_value() || !w->defined()) return at::Tensor();
    TORCH_CHECK(w->scalar_type() == at::kFloat && w->numel() == d, "q/k norm weight: float32 [D]");
    return w->contiguous();
  };
  auto qw = weight(q_norm), kw = weight(k_norm);
  TORCH_CHECK(qw.defined() == kw.defined(), "both q and k norm weights, or neither");
  const float* base = qkv.data_ptr<float>();
  const int64_t ld = qkv.stride(0);
  const Rows x{base, base + hq * d, base + (hq + hkv) * d, ld, ld, ld};
  Prep prep;
  prep.cos = cs.data_ptr<float>();
  prep.sin = sn.data_ptr<float>();
  prep.pos = pp;
  prep.qw = qw.defined() ? qw.data_ptr<float>() : nullptr;
  prep.kw = kw.defined() ? kw.data_ptr<float>() : nullptr;
  prep.eps = static_cast<float>(eps);
  return attend(x, prep, t, hq, hkv, d, cu_seqlens, prefix, qkv.options());
}

}  // namespace

TORCH_LIBRARY(bounded_native_f32, m) {
  m.def("varlen_attention_f32(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, Tensor? prefix=None) -> Tensor");
  m.def("varlen_attention_rope_f32(Tensor qkv, int hq, int hkv, Tensor? q_norm, Tensor? k_norm, float eps, "
        "Tensor cos, Tensor sin, Tensor positions, Tensor cu_seqlens, Tensor? prefix=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(bounded_native_f32, CPU, m) {
  m.impl("varlen_attention_f32", &varlen_attention_f32);
  m.impl("varlen_attention_rope_f32", &varlen_attention_rope_f32);
}
