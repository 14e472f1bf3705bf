// The attention of a beam decode step in float32, on any x86-64 CPU with AVX2 and FMA: the
// native body of kernels/beam_attention.shared_prefix_attention, one call per layer.
//
// A beam row's new token attends to one softmax over its request's prompt keys (shared by
// the request's W beams, never copied per beam), its own earlier suffix keys (the tokens
// its beam chose, up to `suffix_len` slots) and its own new key. Each request's prompt is
// packed once per K/V head (K^T [D, P] and the V rows, zero-padded), then the work is cut
// into items of (request, K/V head, block of BEAMS beams), shared out to the threads of
// torch's pool. Per item the block's W * g query rows (g query heads per K/V head) gathered;
// then scores = Q K^T in one GEMM, the few suffix and own-key scores as dot products, one
// softmax over all of them (its maximum over both parts), P V in a second GEMM plus the
// suffix terms, divided by the sum last. The Python body ran ~20 small tensor ops per layer
// (two matmuls, a log-sum-exp merge of two partial softmaxes, the new key concatenated to
// each beam's suffix: a copy of every suffix K/V), most of a beam step's non-GEMM time.
// Built with -mavx2 -mfma (native.py), loaded only on CPUs with both.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include "f32_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using bounded::f32::exp_row_at;
using bounded::f32::gemm;
using bounded::f32::hsum;
using bounded::f32::round_up;
using bounded::f32::row_max;
using bounded::f32::transpose8;
using bounded::f32::Vec;

constexpr int64_t BEAMS = 8;     // beams per work item: 8 * g query rows against one prompt
constexpr int64_t MAX_SUFFIX = 16;  // suffix slots + the own key: the scores a row keeps apart from the prompt's

inline float dot(const float* a, const float* b, int64_t d) {
  __m256 s = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), s);
  return hsum(s);
}

struct Scratch {
  std::vector<float> qa, scores, acc, sums, extra;
};

struct Prompt {  // one request's keys of one K/V head transposed, its values in whole rows
  std::vector<float> kt, vt;  // kt[c * ldk + j] = K[j][c], zero past plen; vt [width, D], zero past plen
  int64_t plen = 0, ldk = 0, width = 0;
};

struct Step {  // one layer's tensors, as pointers and strides (elements)
  const float *q, *k, *v, *pk, *pv, *sk, *sv;
  const int64_t* prompt_len;
  int64_t qs, ks, vs;  // row strides of q [B, H, D], k/v [B, Hkv, D]
  int64_t w, hq, hkv, d, p, slots, suffix;  // beams per request, heads, K/V heads, head dim, prompt stride, S, valid S
  float* out;  // [B, H*D]
};

// Request r's prompt at K/V head hk, packed once for all its blocks of beams: P V runs over
// `width` keys whose probabilities past plen are zero.
void pack_prompt(const Step& x, int64_t r, int64_t hk, Prompt& pr) {
  const int64_t d = x.d, plen = x.prompt_len[r];
  pr.plen = plen, pr.ldk = round_up(plen, 16), pr.width = round_up(plen, 8);
  const float* keys = x.pk + (r * x.hkv + hk) * x.p * d;
  const float* vals = x.pv + (r * x.hkv + hk) * x.p * d;
  pr.kt.assign(d * pr.ldk, 0.0f);
  const float* krow[8];
  int64_t j = 0;
  for (; j + 8 <= plen; j += 8) {
    for (int l = 0; l < 8; ++l) krow[l] = keys + (j + l) * d;
    for (int64_t c = 0; c < d; c += 8) transpose8(krow, c, pr.kt.data() + c * pr.ldk + j, pr.ldk);
  }
  for (; j < plen; ++j)
    for (int64_t c = 0; c < d; ++c) pr.kt[c * pr.ldk + j] = keys[j * d + c];
  pr.vt.assign(pr.width * d, 0.0f);
  std::copy(vals, vals + plen * d, pr.vt.data());
}

void run_item(const Step& x, const Prompt& pr, int64_t hk, int64_t b0, int64_t nb, float scale, Scratch& s) {
  const int64_t g = x.hq / x.hkv, d = x.d, m = nb * g;
  const int64_t plen = pr.plen, ldk = pr.ldk, width = pr.width;
  // the block's query rows: beam-major, then the g heads of this K/V head
  s.qa.resize(m * d);
  for (int64_t i = 0; i < nb; ++i) {
    const float* src = x.q + (b0 + i) * x.qs + hk * g * d;
    std::copy(src, src + g * d, s.qa.data() + i * g * d);
  }
  s.scores.resize(m * ldk);
  s.acc.resize(m * d);
  gemm(s.qa.data(), d, m, pr.kt.data(), ldk, d, plen, s.scores.data(), ldk);
  // per row: the suffix and own-key scores, one softmax over them and the prompt's
  float raw[MAX_SUFFIX];  // a row's suffix and own-key scores
  std::fill(raw, raw + MAX_SUFFIX, 0.0f);
  s.sums.resize(m);
  s.extra.resize(m * MAX_SUFFIX);
  const int64_t ne = x.suffix + 1;  // the valid suffix slots, then the own new key
  const int64_t slot = x.hkv * d;  // a beam's suffix slots lie this far apart
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t b = b0 + i;
    const float* sk = x.sk + b * x.slots * slot + hk * d;
    const float* own_k = x.k + b * x.ks + hk * d;
    for (int64_t gi = 0; gi < g; ++gi) {
      const int64_t row = i * g + gi;
      const float* qr = s.qa.data() + row * d;
      for (int64_t t = 0; t < x.suffix; ++t) raw[t] = dot(qr, sk + t * slot, d);
      raw[x.suffix] = dot(qr, own_k, d);
      float* sr = s.scores.data() + row * ldk;
      const float mx = row_max(sr, plen, *std::max_element(raw, raw + ne));
      // both parts exponentiated at the joint maximum (exp_row_at zeroes e past ne)
      float* e = s.extra.data() + row * MAX_SUFFIX;
      std::copy(raw, raw + MAX_SUFFIX, e);
      s.sums[row] = exp_row_at(sr, plen, scale, width, mx) + exp_row_at(e, ne, scale, MAX_SUFFIX, mx);
    }
  }
  gemm(s.scores.data(), ldk, m, pr.vt.data(), d, width, d, s.acc.data(), d);
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t b = b0 + i;
    const float* sv = x.sv + b * x.slots * slot + hk * d;
    const float* own_v = x.v + b * x.vs + hk * d;
    for (int64_t gi = 0; gi < g; ++gi) {
      const int64_t row = i * g + gi;
      const float* e = s.extra.data() + row * MAX_SUFFIX;
      float* a = s.acc.data() + row * d;
      for (int64_t t = 0; t <= x.suffix; ++t) {
        const Vec et(e[t]);
        const float* vr = t < x.suffix ? sv + t * slot : own_v;
        for (int64_t c = 0; c < d; c += Vec::size()) (Vec::loadu(a + c) + et * Vec::loadu(vr + c)).store(a + c);
      }
      const Vec inv(1.0f / s.sums[row]);
      float* o = x.out + b * x.hq * d + (hk * g + gi) * d;
      for (int64_t c = 0; c < d; c += Vec::size()) (Vec::loadu(a + c) * inv).store(o + c);
    }
  }
}

bool supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// q [B, H, D], k/v [B, Hkv, D] (the new tokens' K/V; rows any stride, heads and dims packed);
// prompt_k/v [R, Hkv, P, D]; prompt_len [R] (1..P valid keys each); suffix_k/v [B, S, Hkv, D];
// suffix_len [] (valid slots, < S + 1, the same for every row) -> [B, H*D]. B = R * W, the W
// rows of a request back to back. All float32 on the CPU; D a multiple of 16.
at::Tensor beam_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& prompt_k, const at::Tensor& prompt_v, const at::Tensor& prompt_len,
                              const at::Tensor& suffix_k, const at::Tensor& suffix_v, const at::Tensor& suffix_len) {
  for (const at::Tensor* x : {&q, &k, &v, &prompt_k, &prompt_v, &suffix_k, &suffix_v})
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat, "beam attention: float32 CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q [B, H, D], k/v [B, Hkv, D]");
  TORCH_CHECK(prompt_k.dim() == 4 && suffix_k.dim() == 4, "prompt_k [R, Hkv, P, D], suffix_k [B, S, Hkv, D]");
  const int64_t b = q.size(0), hq = q.size(1), d = q.size(2), hkv = k.size(1);
  const int64_t r = prompt_k.size(0), p = prompt_k.size(2), slots = suffix_k.size(1);
  TORCH_CHECK(hkv > 0 && hq % hkv == 0 && k.size(0) == b && k.size(2) == d && v.sizes() == k.sizes(),
              "q [B, Hq, D], k/v [B, Hkv, D] with Hkv dividing Hq");
  TORCH_CHECK(r > 0 && b % r == 0, "B = R * W rows: ", b, " rows for ", r, " requests");
  TORCH_CHECK(prompt_k.size(1) == hkv && prompt_k.size(3) == d && prompt_v.sizes() == prompt_k.sizes(),
              "prompt_k/v [R, Hkv, P, D]");
  TORCH_CHECK(suffix_k.size(0) == b && suffix_k.size(2) == hkv && suffix_k.size(3) == d &&
              suffix_v.sizes() == suffix_k.sizes(), "suffix_k/v [B, S, Hkv, D]");
  TORCH_CHECK(d % 16 == 0 && d <= 512, "head dim a multiple of 16, at most 512");
  TORCH_CHECK(supported(), "this CPU has no AVX2 and FMA");
  const int64_t valid = suffix_len.item<int64_t>();
  TORCH_CHECK(valid >= 0 && valid <= slots && valid + 1 <= MAX_SUFFIX, "suffix_len ", valid, " outside 0..", slots,
              " (at most ", MAX_SUFFIX - 1, ")");
  auto lens = prompt_len.to(at::kLong).contiguous();
  TORCH_CHECK(lens.numel() == r, "prompt_len: one per request");
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t i = 0; i < r; ++i) TORCH_CHECK(lp[i] >= 1 && lp[i] <= p, "prompt_len ", lp[i], " outside 1..", p);
  auto rows_of = [](const at::Tensor& x) {  // any row stride; heads and dims packed
    return x.stride(2) == 1 && x.stride(1) == x.size(2) ? x : x.contiguous();
  };
  auto qc = rows_of(q), kc = rows_of(k), vc = rows_of(v);
  auto pk = prompt_k.contiguous(), pv = prompt_v.contiguous(), sk = suffix_k.contiguous(), sv = suffix_v.contiguous();
  auto out = at::empty({b, hq * d}, q.options());
  const int64_t w = b / r;
  const Step x{qc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(), pk.data_ptr<float>(),
               pv.data_ptr<float>(), sk.data_ptr<float>(), sv.data_ptr<float>(), lp, qc.stride(0), kc.stride(0),
               vc.stride(0), w, hq, hkv, d, p, slots, valid, out.data_ptr<float>()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t blocks = (w + BEAMS - 1) / BEAMS, items = r * hkv * blocks;
  std::vector<Prompt> prompts(r * hkv);  // each packed once, read by all its request's blocks
  at::parallel_for(0, r * hkv, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) pack_prompt(x, u / hkv, u % hkv, prompts[u]);
  });
  at::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    Scratch s;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t unit = i / blocks, req = unit / hkv, hk = unit % hkv, first = i % blocks * BEAMS;
      run_item(x, prompts[unit], hk, req * w + first, std::min(BEAMS, w - first), scale, s);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bounded_native_f32, m) {
  m.def("beam_attention_f32(Tensor q, Tensor k, Tensor v, Tensor prompt_k, Tensor prompt_v, Tensor prompt_len, "
        "Tensor suffix_k, Tensor suffix_v, Tensor suffix_len) -> Tensor");
}

TORCH_LIBRARY_IMPL(bounded_native_f32, CPU, m) { m.impl("beam_attention_f32", &beam_attention_f32); }
