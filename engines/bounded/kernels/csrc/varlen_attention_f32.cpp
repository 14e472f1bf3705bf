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
// float32 (the exponentials summed as they are written, the division deferred to the output
// rows), P V. Both GEMMs run one register-tiled micro-kernel (6 rows x 16 columns, FMA).
// Built with -mavx2 -mfma (native.py), loaded only on CPUs with both.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

constexpr int64_t BLOCK = 32;  // query rows per block: its keys stop at its last row

struct Unit {             // one sequence and one K/V head
  int64_t own0, own1;     // the sequence's packed rows
  int64_t pre0, pre_len;  // prefix rows (pre_len 0: none)
  int64_t head;           // K/V head
  int64_t work;
};

struct Rows {             // q/k/v [T, H, D], rows `stride` elements apart
  const float* q;
  const float* k;
  const float* v;
  int64_t qs, ks, vs;
};

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// c[R, 16] (ldc) = a[R, kdim] (rows lda apart) x b[kdim, 16] (rows ldb apart). Columns past
// the caller's width are computed from b's padding and never read. The accumulators are named
// registers, not an array: gcc kept an array of them on the stack, storing all twelve at every
// step (a store-bound loop at a quarter of the FMA rate).
template <int R>
void micro(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t kdim, float* c, int64_t ldc) {
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

// c[m, n rounded up to 16] = a[m, kdim] x b[kdim, n]; b's and c's rows hold at least n
// rounded up to 16 floats.
void gemm(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t kdim, int64_t n, float* c,
          int64_t ldc) {
  static constexpr std::array<Micro, MR> table = {&micro<1>, &micro<2>, &micro<3>, &micro<4>, &micro<5>, &micro<6>};
  for (int64_t j = 0; j < n; j += 16) {  // a 16-column panel of b stays in L1 across the rows
    for (int64_t i = 0; i < m; i += MR) table[std::min<int64_t>(MR, m - i) - 1](a + i * lda, lda, b + j, ldb, kdim,
                                                                                c + i * ldc + j, ldc);
  }
}

// row[0:n] = exp(row * scale - max * scale) in place, zero from n up to `width` (a multiple
// of 8); returns their sum.
float exp_row(float* row, int64_t n, float scale, int64_t width) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
  std::fill(row + n, row + width, -std::numeric_limits<float>::infinity());
  const Vec vscale(scale), vshift(mx * scale);
  Vec vsum(0.0f);
  for (int64_t j = 0; j < width; j += Vec::size()) {
    const Vec e = (Vec::loadu(row + j) * vscale - vshift).exp_u20();
    const Vec z = Vec::blendv(e, Vec(0.0f), Vec::loadu(row + j) == Vec(-std::numeric_limits<float>::infinity()));
    z.store(row + j);
    vsum = vsum + z;
  }
  alignas(32) float lanes[Vec::size()];
  vsum.store(lanes);
  float sum = 0.0f;
  for (float x : lanes) sum += x;
  return sum;
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

struct Scratch {
  std::vector<float> kt, vt, scores, acc;
  std::vector<float> sums;
};

void run_unit(const Unit& u, const Rows& x, float* out, int64_t hq, int64_t hkv, int64_t d, float scale, Scratch& w) {
  const int64_t g = hq / hkv;
  const int64_t keys = u.pre_len + (u.own1 - u.own0);
  const int64_t ldk = round_up(keys, 16), ldv = round_up(d, 16);
  auto key_row = [&](int64_t j) { return j < u.pre_len ? u.pre0 + j : u.own0 + (j - u.pre_len); };
  // once per unit: kt[c * ldk + j] = K[j][c]; vt[j * ldv + c] = V[j][c]; the padding zero (a
  // block's P V runs over its width rounded up to 8 keys, whose probabilities are zero)
  w.kt.assign(d * ldk, 0.0f);
  w.vt.assign(ldk * ldv, 0.0f);
  const float* krow[8];
  int64_t j = 0;
  for (; j + 8 <= keys && d % 8 == 0; j += 8) {  // 8 x 8 tiles (a column-by-column copy was 1/4 of the unit's own time)
    for (int l = 0; l < 8; ++l) krow[l] = x.k + key_row(j + l) * x.ks + u.head * d;
    for (int64_t c = 0; c < d; c += 8) transpose8(krow, c, w.kt.data() + c * ldk + j, ldk);
  }
  for (; j < keys; ++j) {
    const float* kr = x.k + key_row(j) * x.ks + u.head * d;
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
  for (int64_t r0 = u.own0; r0 < u.own1; r0 += BLOCK) {
    const int64_t m = std::min(BLOCK, u.own1 - r0);
    const int64_t seen = u.pre_len + (r0 + m - u.own0);  // keys up to the block's last row
    const int64_t width = round_up(seen, 8);  // <= ldk
    for (int64_t gi = 0; gi < g; ++gi) {
      const int64_t h = u.head * g + gi;
      gemm(x.q + r0 * x.qs + h * d, x.qs, m, w.kt.data(), ldk, d, seen, w.scores.data(), ldk);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t valid = u.pre_len + (r0 + r - u.own0) + 1;  // causal: keys up to this row
        w.sums[r] = exp_row(w.scores.data() + r * ldk, valid, scale, width);
      }
      gemm(w.scores.data(), ldk, m, w.vt.data(), ldv, width, d, w.acc.data(), ldv);
      for (int64_t r = 0; r < m; ++r) {
        const Vec inv(1.0f / w.sums[r]);
        float* o = out + (r0 + r) * hq * d + h * d;
        const float* a = w.acc.data() + r * ldv;
        int64_t c = 0;
        for (; c + Vec::size() <= d; c += Vec::size()) (Vec::loadu(a + c) * inv).store(o + c);
        for (; c < d; ++c) o[c] = a[c] / w.sums[r];
      }
    }
  }
}

bool supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

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
  auto cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t s = cu.numel() - 1;
  const int64_t* off = cu.data_ptr<int64_t>();
  TORCH_CHECK(s >= 0 && (s == 0 || off[s] == t), "cu_seqlens must end at T");
  std::vector<int64_t> pre(s, -1);
  if (prefix.has_value() && prefix->defined()) {
    auto p = prefix->to(at::kLong).contiguous();
    TORCH_CHECK(p.numel() == s, "prefix: one entry per sequence");
    std::copy(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + s, pre.begin());
  }
  std::vector<Unit> units;
  for (int64_t i = 0; i < s; ++i) {
    const int64_t a = off[i], b = off[i + 1];
    TORCH_CHECK(a < b, "empty sequence ", i);
    int64_t p0 = 0, plen = 0;
    if (pre[i] >= 0) {
      TORCH_CHECK(pre[i] < i && pre[pre[i]] < 0, "sequence ", i, ": prefix ", pre[i],
                  " must be an earlier sequence without a prefix");
      p0 = off[pre[i]];
      plen = off[pre[i] + 1] - p0;
    }
    for (int64_t h = 0; h < hkv; ++h) units.push_back({a, b, p0, plen, h, (b - a) * (plen + (b - a) / 2 + 1)});
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.work > b.work; });
  auto out = at::empty({t, hq * d}, q.options());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* op = out.data_ptr<float>();
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(units.size());
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    Scratch w;
    for (int64_t i = next++; i < n; i = next++) run_unit(units[i], x, op, hq, hkv, d, scale, w);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(bounded_native_f32, m) {
  m.def("varlen_attention_f32(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, Tensor? prefix=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(bounded_native_f32, CPU, m) { m.impl("varlen_attention_f32", &varlen_attention_f32); }
