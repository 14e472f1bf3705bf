// Causal attention within each sequence of a packed bf16 prefill batch, on a CPU: the
// native body of bounded::varlen_attention (kernels/attention.py). One call per layer; no
// Python, no padding, no per-sequence tensor objects.
//
// A sequence may continue an earlier one, its prefix (a query whose K/V its items share):
// its rows then see every prefix key and their own keys up to themselves.
//
// Work is cut into units of (sequence, K/V head), which the threads of torch's pool take
// largest-first from a shared counter. Per unit, the keys and values are packed once into
// pairs along the contraction (the layout of AVX512-BF16's dot-product instruction); then per
// block of BLOCK query rows, whose keys stop at its last row (the causal triangle's upper
// blocks are never computed), and per query head of the group: scores = Q K^T
// (bf16 products, float32 sums), scaled, masked, softmax in float32, probabilities rounded
// to bf16 (as the eager softmax(...).to(bf16) is), P V summed in float32 and rounded to the
// bf16 output. The GEMMs are a register-tiled micro-kernel (4 rows x 64 columns) over that
// instruction: ATen's small bf16 GEMMs return bf16 (the scores need float32), and its
// float32-output path ran at a third of the rate here and serialised across threads.
// CPUs without AVX512-BF16 are refused (native.py never loads it there; the kernel checks too).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <immintrin.h>

#include "amx_tiles.h"
#include "varlen_units.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace {

using at::BFloat16;
using Vec = at::vec::Vectorized<float>;

constexpr int64_t BLOCK = 32;  // query rows per block: its keys stop at its last row

using bounded::Unit;

struct Rows {              // q/k/v [T, H, D] with rows `stride` elements apart (views of a fused projection)
  const BFloat16* q;
  const BFloat16* k;
  const BFloat16* v;
  int64_t qs, ks, vs;
};

struct Prep {              // the fused entry: q/k as projected, RMS-normed (weights, or none) and rotated here
  const BFloat16* cos = nullptr;  // [P, D] rotary tables (nullptr: q/k arrive ready)
  const BFloat16* sin = nullptr;
  const int64_t* pos = nullptr;   // [T] each row's position
  const BFloat16* qw = nullptr;   // [D] q/k norm weights (nullptr: no norm, as Qwen2)
  const BFloat16* kw = nullptr;
  float eps = 0.0f;
  const float* scale = nullptr;   // [T] each row's scale (nullptr: none): an int8 GEMM's product
};

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// The lanes of a 16-float vector at j that lie below n.
inline __mmask16 lanes(int64_t j, int64_t n) {
  const int64_t left = n - j;
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// dst[0:n] = bf16(exp(row * scale - max)), zero up to `width`; returns the sum of the
// exponentials (the caller divides the output rows by it: flash attention's deferred
// normalisation, so the row is read and written once). Whole vectors, the last one masked:
// a row of a short sequence is mostly its tail (a scalar tail was ~1/3 of prefill_15's keys).
BF16_TARGET float exp_row(const float* row, int64_t n, float scale, BFloat16* dst, int64_t width) {
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = lanes(j, n);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, row + j));
  }
  const float mx = _mm512_reduce_max_ps(vmax);
  const Vec vscale(scale), vshift(mx * scale);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = lanes(j, n);
    const __m512 e = _mm512_maskz_mov_ps(m, (Vec(_mm512_maskz_loadu_ps(m, row + j)) * vscale - vshift).exp_u20());
    vsum = _mm512_add_ps(vsum, e);
    _mm256_mask_storeu_epi16(dst + j, m, (__m256i)_mm512_cvtneps_pbh(e));  // round to nearest even, as convert
  }
  std::fill(dst + n, dst + width, BFloat16(0.0f));
  return _mm512_reduce_add_ps(vsum);
}


BF16_TARGET inline __m512 load_bf16(const BFloat16* p) {  // 16 bf16 -> float32 (exact)
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// Row `row` of q, k or v at src as the kernel reads it: src itself, or -- where the entry has
// row scales (an int8 GEMM's product) -- tmp[0:d] = bf16(src[0:d] * scale[row]), rounded to
// nearest even as the graph's multiply and cast to bf16 gave it; d % 16 == 0
BF16_TARGET const BFloat16* read_row(const BFloat16* src, const float* scale, int64_t row, int64_t d, BFloat16* tmp) {
  if (scale == nullptr) return src;
  const __m512 vs = _mm512_set1_ps(scale[row]);
  for (int64_t c = 0; c < d; c += 16)
    _mm256_storeu_si256((__m256i*)(tmp + c), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(load_bf16(src + c), vs)));
  return tmp;
}

// dst[0:d] = bf16(rotate(norm(src))) for one head's row at position `pos`, in float32 with one
// rounding at the end (as the compiled graph's fused norm + RoPE kernel): norm x * rsqrt(mean(x^2)
// + eps) * w, then RoPE's rotate-half form x * cos + (-x_hi, x_lo) * sin. d % 32 == 0.
BF16_TARGET void prep_row(const BFloat16* src, const BFloat16* w, const Prep& p, int64_t pos, int64_t d,
                          BFloat16* dst) {
  alignas(64) float x[512];
  __m512 ss = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += 16) {
    const __m512 a = load_bf16(src + c);
    _mm512_store_ps(x + c, a);
    ss = _mm512_fmadd_ps(a, a, ss);
  }
  if (w != nullptr) {
    const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(d) + p.eps));
    for (int64_t c = 0; c < d; c += 16)
      _mm512_store_ps(x + c, _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(x + c), r), load_bf16(w + c)));
  }
  const int64_t h = d / 2;
  const BFloat16* cs = p.cos + pos * d;
  const BFloat16* sn = p.sin + pos * d;
  for (int64_t c = 0; c < h; c += 16) {
    const __m512 lo = _mm512_load_ps(x + c), hi = _mm512_load_ps(x + c + h);
    const __m512 out_lo = _mm512_fnmadd_ps(hi, load_bf16(sn + c), _mm512_mul_ps(lo, load_bf16(cs + c)));
    const __m512 out_hi = _mm512_fmadd_ps(lo, load_bf16(sn + c + h), _mm512_mul_ps(hi, load_bf16(cs + c + h)));
    _mm256_storeu_si256((__m256i*)(dst + c), (__m256i)_mm512_cvtneps_pbh(out_lo));
    _mm256_storeu_si256((__m256i*)(dst + c + h), (__m256i)_mm512_cvtneps_pbh(out_hi));
  }
}

// c[R, 16V] (float32, ldc; the last vector masked to `cols`) = a[R, 2kp] (bf16 rows, lda)
// x b, where b holds pairs: b[p * ldb + j] = (B[2p][j], B[2p+1][j]) as one 32-bit word.
template <int R, int V>
BF16_TARGET void micro(const BFloat16* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t kp, float* c,
                       int64_t ldc, int64_t cols) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < V; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[V];
    for (int j = 0; j < V; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + p * ldb + 16 * j);
    for (int r = 0; r < R; ++r) {
      int32_t word;
      std::memcpy(&word, a + r * lda + 2 * p, sizeof(word));
      const __m512bh av = (__m512bh)_mm512_set1_epi32(word);
      for (int j = 0; j < V; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < V; ++j) {
      _mm512_mask_storeu_ps(c + r * ldc + 16 * j, lanes(16 * j, cols), acc[r][j]);
    }
}

using Micro = void (*)(const BFloat16*, int64_t, const uint32_t*, int64_t, int64_t, float*, int64_t, int64_t);

template <int R>
constexpr std::array<Micro, 4> micros() {
  return {&micro<R, 1>, &micro<R, 2>, &micro<R, 3>, &micro<R, 4>};
}

// c[m, n] = a[m, 2kp] x b (pairs, ldb >= n rounded up to 16)
void gemm_pairs(const BFloat16* a, int64_t lda, int64_t m, const uint32_t* b, int64_t ldb, int64_t kp, int64_t n,
                float* c, int64_t ldc) {
  static const std::array<std::array<Micro, 4>, 4> table = {micros<1>(), micros<2>(), micros<3>(), micros<4>()};
  for (int64_t j = 0; j < n; j += 64) {  // a 64-column panel of b stays in L1 across the rows
    const int64_t cols = std::min<int64_t>(64, n - j);
    const Micro* row = nullptr;
    for (int64_t i = 0; i < m; i += 4) {
      const int64_t rows = std::min<int64_t>(4, m - i);
      row = table[rows - 1].data();
      row[(cols + 15) / 16 - 1](a + i * lda, lda, b + j, ldb, kp, c + i * ldc + j, ldc, cols);
    }
  }
}

// The products of gemm_pairs on AMX tiles, where the CPU has them (tiles configured for 16
// rows; the pairs are a tile's B operand as they lie): c[16 rt rows, n] = a[16 rt rows, 32 kt]
// (bf16, lda) x b (pairs, ldb words a pair row); rt 1 or 2, n a multiple of 16. The rows of a
// and c past the block's are scratch.
template <int RT>
AMX_TARGET void tile_rows(const BFloat16* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t kt, int64_t n,
                          float* c, int64_t ldc) {
  constexpr int64_t W = sizeof(uint32_t);
  for (int64_t j = 0; j < n; j += 32) {
    if (n - j >= 32)
      bounded::tile_product<RT, 2>(a, lda * 2, b + j, 16 * W, 16 * ldb * W, ldb * W, kt, c + j, ldc);
    else
      bounded::tile_product<RT, 1>(a, lda * 2, b + j, 16 * W, 16 * ldb * W, ldb * W, kt, c + j, ldc);
  }
}

void tile_gemm(const BFloat16* a, int64_t lda, int64_t rt, const uint32_t* b, int64_t ldb, int64_t kt, int64_t n,
               float* c, int64_t ldc) {
  rt == 2 ? tile_rows<2>(a, lda, b, ldb, kt, n, c, ldc) : tile_rows<1>(a, lda, b, ldb, kt, n, c, ldc);
}

// Whether the products run on AMX tiles (head dims of whole tile steps, 32): fixed per process
// (BOUNDED_ATTENTION_AMX=0 keeps the AVX512-BF16 form, to compare the two).
bool use_amx(int64_t d) {
  static const bool ok = bounded::amx_permitted("BOUNDED_ATTENTION_AMX");
  return ok && d % 32 == 0;
}

// dst[p * ldd + j] = words[row[j] + p] for j < n, p < np: the [n, np] matrix of 32-bit words
// whose row j starts at words + row[j], transposed. 16 rows at a time: one masked gather per
// word column, one 64-byte store (a word-by-word transpose scatters 4-byte stores ldd apart).
BF16_TARGET void transpose_words(const uint32_t* words, const int64_t* row, int64_t n, int64_t np, uint32_t* dst,
                                 int64_t ldd) {
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const __mmask16 m = lanes(j0, n);
    alignas(64) int64_t idx[16] = {0};
    for (int64_t l = 0; l < 16 && j0 + l < n; ++l) idx[l] = row[j0 + l];
    const __m512i lo = _mm512_load_si512(idx), hi = _mm512_load_si512(idx + 8);
    for (int64_t p = 0; p < np; ++p) {
      const int* base = reinterpret_cast<const int*>(words + p);
      const __m256i a = _mm512_mask_i64gather_epi32(_mm256_setzero_si256(), static_cast<__mmask8>(m), lo, base, 4);
      const __m256i b = _mm512_mask_i64gather_epi32(_mm256_setzero_si256(), static_cast<__mmask8>(m >> 8), hi, base, 4);
      _mm512_mask_storeu_epi32(dst + p * ldd + j0, m, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
    }
  }
}

// dst[c] = (a[c], b[c]) as one 32-bit word for c < d (b nullptr: zeros); d % 16 == 0
BF16_TARGET void interleave_rows(const BFloat16* a, const BFloat16* b, int64_t d, uint32_t* dst) {
  alignas(64) static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                  8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                  24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i il = _mm512_load_si512(lo_idx), ih = _mm512_load_si512(hi_idx);
  int64_t c = 0;
  for (; c + 32 <= d; c += 32) {
    const __m512i x = _mm512_loadu_si512(a + c);
    const __m512i y = b != nullptr ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + c, _mm512_permutex2var_epi16(x, il, y));
    _mm512_storeu_si512(dst + c + 16, _mm512_permutex2var_epi16(x, ih, y));
  }
  for (; c < d; ++c) dst[c] = static_cast<uint32_t>(a[c].x) | (b != nullptr ? static_cast<uint32_t>(b[c].x) << 16 : 0u);
}

// out[0:d] = bf16(acc[0:d] * inv), rounded to nearest even (as ATen's convert); d % 16 == 0
BF16_TARGET void normalise_row(const float* acc, float inv, int64_t d, BFloat16* out) {
  const __m512 s = _mm512_set1_ps(inv);
  for (int64_t c = 0; c < d; c += 16)
    _mm256_storeu_si256((__m256i*)(out + c), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(acc + c), s)));
}

// Rows of q/k/v lie a whole projection apart (~8 KB): the hardware prefetcher does not follow
// them, and a row read cold stalled prep_row on its first load (2/3 of its time). So the rows
// AHEAD of the one being read are requested early.
constexpr int64_t AHEAD = 4;

inline void prefetch_row(const BFloat16* row, int64_t d) {
  for (int64_t b = 0; b < d * 2; b += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + b, _MM_HINT_T0);
}

// Further ahead, into L2 only: a unit's key rows FAR ahead and its value rows while the keys
// are prepared (the L1 requests above were the most a core keeps in flight, and stalled).
constexpr int64_t FAR = 16;

inline void prefetch_row_l2(const BFloat16* row, int64_t d) {
  for (int64_t b = 0; b < d * 2; b += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + b, _MM_HINT_T1);
}

// A (row, head) of the output is 4 lines of a row 4 KB long, written last: requested for
// ownership while the row's softmax computes, so the stores do not wait on the read each line
// needs first (PREFETCHW, which every AVX-512 CPU has). On a Xeon with AMX these three took
// 5-15 % off a prefill_15 layer of attention (e.g. 3.71 -> 3.19 ms; the two builds alternated
// in one process, 2026-12-06).
inline void prefetch_row_for_write(const BFloat16* row, int64_t d) {
  for (int64_t b = 0; b < d * 2; b += 64) asm volatile("prefetchw %0" ::"m"(*(reinterpret_cast<const char*>(row) + b)));
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

struct Scratch {
  std::vector<uint32_t> kt, vt;  // keys and values in pairs
  std::vector<float> scores, acc, sums;
  std::vector<BFloat16> probs, qp, kp;  // rows prepared by prep_row (AMX: copied, whole tiles)
  std::vector<BFloat16> scaled;         // a row scaled (Prep::scale), then prepared or interleaved
  std::optional<bounded::Tiles> tiles;  // this worker's AMX tiles, configured at its first unit
};

void run_unit(const Unit& u, const Rows& x, const Prep& prep, BFloat16* out, int64_t hq, int64_t hkv, int64_t d,
              float scale, Scratch& w) {
  const bool amx = use_amx(d);
  if (amx && !w.tiles) w.tiles.emplace(true, 16);
  const int64_t g = hq / hkv;
  const int64_t keys = u.pre_len + (u.own1 - u.own0);
  const int64_t ldk = round_up(keys, 16), kpairs = (keys + 1) / 2;
  auto key_row = [&](int64_t j) { return j < u.pre_len ? u.pre0 + j : u.own0 + (j - u.pre_len); };
  // once per unit, for all its blocks: K^T in pairs along d, kt[p * ldk + j] = (K[j][2p],
  // K[j][2p+1]); V in pairs along the keys, vt[p * d + c] = (V[2p][c], V[2p+1][c]) (AMX: zero
  // pairs to a whole tile step, 32 keys)
  w.kt.assign(d / 2 * ldk, 0u);
  const int64_t vpairs = amx ? round_up(kpairs, 16) : kpairs;
  w.vt.resize(vpairs * d);
  std::fill(w.vt.begin() + kpairs * d, w.vt.end(), 0u);
  // the keys' rows as 32-bit words (a pair of bf16 each): prepared (normed + rotated) into
  // scratch first where the entry prepares them, else read where they lie
  const uint32_t* kwords;
  std::vector<int64_t> krow(keys);
  if (prep.cos != nullptr) {
    w.kp.resize(keys * d);
    w.scaled.resize(2 * d);
    for (int64_t j = 0; j < keys; ++j) {
      if (j + AHEAD < keys) prefetch_row(x.k + key_row(j + AHEAD) * x.ks + u.head * d, d);
      if (j + FAR < keys) prefetch_row_l2(x.k + key_row(j + FAR) * x.ks + u.head * d, d);
      for (int64_t a = 2 * j; a < std::min(keys, 2 * j + 2); ++a)
        prefetch_row_l2(x.v + key_row(a) * x.vs + u.head * d, d);
      const int64_t row = key_row(j);
      const BFloat16* src = read_row(x.k + row * x.ks + u.head * d, prep.scale, row, d, w.scaled.data());
      prep_row(src, prep.kw, prep, prep.pos[row], d, w.kp.data() + j * d);
      krow[j] = j * d / 2;
    }
    kwords = reinterpret_cast<const uint32_t*>(w.kp.data());
  } else {
    for (int64_t j = 0; j < keys; ++j) krow[j] = (key_row(j) * x.ks + u.head * d) / 2;
    kwords = reinterpret_cast<const uint32_t*>(x.k);
  }
  transpose_words(kwords, krow.data(), keys, d / 2, w.kt.data(), ldk);
  for (int64_t p = 0; p < kpairs; ++p) {
    const BFloat16* v0 = read_row(x.v + key_row(2 * p) * x.vs + u.head * d, prep.scale, key_row(2 * p), d,
                                  w.scaled.data());
    const BFloat16* v1 = 2 * p + 1 < keys ? read_row(x.v + key_row(2 * p + 1) * x.vs + u.head * d, prep.scale,
                                                     key_row(2 * p + 1), d, w.scaled.data() + d)
                                          : nullptr;
    for (int64_t a = 2 * (p + AHEAD / 2); a < std::min(keys, 2 * (p + AHEAD / 2) + 2); ++a)
      prefetch_row(x.v + key_row(a) * x.vs + u.head * d, d);
    interleave_rows(v0, v1, d, w.vt.data() + p * d);
  }
  // a block's rows: whole 16-row tiles where AMX computes (the rows past the block are scratch)
  const int64_t rows = std::min<int64_t>(BLOCK, u.own1 - u.own0), buf_rows = amx ? round_up(rows, 16) : rows;
  w.scores.resize(buf_rows * ldk);
  w.probs.resize(buf_rows * (amx ? round_up(keys, 32) : 2 * kpairs));
  w.acc.resize(buf_rows * d);
  w.sums.resize(rows);
  if (prep.cos != nullptr || amx) w.qp.resize(buf_rows * d);
  for (int64_t r0 = u.own0; r0 < u.own1; r0 += BLOCK) {
    const int64_t m = std::min(BLOCK, u.own1 - r0), rt = (m + 15) / 16;
    const int64_t seen = u.pre_len + (r0 + m - u.own0);  // keys up to the block's last row
    const int64_t pairs = (seen + 1) / 2, width = amx ? round_up(seen, 32) : 2 * pairs;
    for (int64_t gi = 0; gi < g; ++gi) {
      const int64_t h = u.head * g + gi;
      const BFloat16* qa = x.q + r0 * x.qs + h * d;
      int64_t lda = x.qs;
      if (prep.cos != nullptr) {  // each (row, head) of q is prepared once: its block is this unit's
        for (int64_t r = 0; r < m; ++r) {
          if (r + AHEAD < m) prefetch_row(qa + (r + AHEAD) * x.qs, d);
          prep_row(read_row(qa + r * x.qs, prep.scale, r0 + r, d, w.scaled.data()), prep.qw, prep, prep.pos[r0 + r], d,
                   w.qp.data() + r * d);
        }
        qa = w.qp.data();
        lda = d;
      } else if (amx) {  // a tile reads whole 16-row blocks: the rows past the batch's last are not there
        for (int64_t r = 0; r < m; ++r) std::memcpy(w.qp.data() + r * d, qa + r * x.qs, d * sizeof(BFloat16));
        qa = w.qp.data();
        lda = d;
      }
      if (amx)
        tile_gemm(qa, lda, rt, w.kt.data(), ldk, d / 32, round_up(seen, 16), w.scores.data(), ldk);
      else
        gemm_pairs(qa, lda, m, w.kt.data(), ldk, d / 2, seen, w.scores.data(), ldk);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t valid = u.pre_len + (r0 + r - u.own0) + 1;  // causal: keys up to this row
        prefetch_row_for_write(out + (r0 + r) * hq * d + h * d, d);
        w.sums[r] = exp_row(w.scores.data() + r * ldk, valid, scale, w.probs.data() + r * width, width);
      }
      if (amx)
        tile_gemm(w.probs.data(), width, rt, w.vt.data(), d, width / 32, d, w.acc.data(), d);
      else
        gemm_pairs(w.probs.data(), width, m, w.vt.data(), d, pairs, d, w.acc.data(), d);
      for (int64_t r = 0; r < m; ++r) normalise_row(w.acc.data() + r * d, 1.0f / w.sums[r], d, out + (r0 + r) * hq * d + h * d);
    }
  }
}

bool supported() { return __builtin_cpu_supports("avx512bf16"); }

at::Tensor attend(const Rows& x, const Prep& prep, int64_t t, int64_t hq, int64_t hkv, int64_t d,
                  const at::Tensor& cu_seqlens, const c10::optional<at::Tensor>& prefix, const at::TensorOptions& opts) {
  const std::vector<Unit> units = bounded::varlen_units(cu_seqlens, prefix, t, hkv);
  auto out = at::empty({t, hq * d}, opts);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto* op = out.data_ptr<BFloat16>();
  bounded::run_units<Scratch>(units, [&](const Unit& u, Scratch& w) { run_unit(u, x, prep, op, hq, hkv, d, scale, w); });
  return out;
}

at::Tensor varlen_attention_bf16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, const c10::optional<at::Tensor>& prefix) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "CPU tensors only");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                  v.scalar_type() == at::kBFloat16, "bfloat16 q/k/v only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q/k/v: [T, H, D]");
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2), hkv = k.size(1);
  TORCH_CHECK(hkv > 0 && hq % hkv == 0 && k.size(2) == d && v.sizes() == k.sizes() && k.size(0) == t,
              "q [T, Hq, D], k/v [T, Hkv, D] with Hkv dividing Hq");
  TORCH_CHECK(d % 16 == 0, "head dim a multiple of 16");
  TORCH_CHECK(supported(), "this CPU has no AVX512-BF16");
  auto rows_of = [](const at::Tensor& x) {  // any row stride; heads and dims packed
    return x.stride(2) == 1 && x.stride(1) == x.size(2) ? x : x.contiguous();
  };
  auto qc = rows_of(q), kc = rows_of(k), vc = rows_of(v);
  const Rows x{qc.data_ptr<BFloat16>(), kc.data_ptr<BFloat16>(), vc.data_ptr<BFloat16>(),
               qc.stride(0), kc.stride(0), vc.stride(0)};
  return attend(x, Prep{}, t, hq, hkv, d, cu_seqlens, prefix, q.options());
}

// The same attention over the fused projection qkv [T, (Hq + 2 Hkv) D] as the qkv GEMM gives
// it: q and k RMS-normed per head (q_norm/k_norm [D], or none) and rotated at `positions` by
// the tables cos/sin [P, D] here, as they are read (the graph's separate norm + RoPE kernel
// wrote and read them back: 2.6 ms a prefill_15 layer on Zen 4). With `row_scale` [T] float32,
// qkv is an int8 GEMM's product without its rows' scales (kernels/int8.int8_product): each row
// is scaled and rounded to bf16 as it is read, the values the graph's own pass over the whole
// [T, (Hq + 2 Hkv) D] wrote before (model/decoder.Layer.attend_fused).
at::Tensor varlen_attention_rope_bf16(const at::Tensor& qkv, int64_t hq, int64_t hkv,
                                      const c10::optional<at::Tensor>& q_norm, const c10::optional<at::Tensor>& k_norm,
                                      double eps, const at::Tensor& cos, const at::Tensor& sin,
                                      const at::Tensor& positions, const at::Tensor& cu_seqlens,
                                      const c10::optional<at::Tensor>& prefix,
                                      const c10::optional<at::Tensor>& row_scale) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.scalar_type() == at::kBFloat16 && qkv.dim() == 2 && qkv.stride(1) == 1,
              "qkv: a bfloat16 CPU [T, (Hq + 2 Hkv) D] with unit column stride");
  TORCH_CHECK(hkv > 0 && hq % hkv == 0 && qkv.size(1) % (hq + 2 * hkv) == 0, "qkv: (Hq + 2 Hkv) heads, Hkv dividing Hq");
  const int64_t t = qkv.size(0), d = qkv.size(1) / (hq + 2 * hkv);
  TORCH_CHECK(d % 32 == 0 && d <= 512, "head dim a multiple of 32, at most 512");
  TORCH_CHECK(supported(), "this CPU has no AVX512-BF16");
  auto table = [&](const at::Tensor& x, const char* name) {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) == d, name, ": bfloat16 [P, D]");
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
    TORCH_CHECK(w->scalar_type() == at::kBFloat16 && w->numel() == d, "q/k norm weight: bfloat16 [D]");
    return w->contiguous();
  };
  auto qw = weight(q_norm), kw = weight(k_norm);
  TORCH_CHECK(qw.defined() == kw.defined(), "both q and k norm weights, or neither");
  const BFloat16* base = qkv.data_ptr<BFloat16>();
  const int64_t ld = qkv.stride(0);
  const Rows x{base, base + hq * d, base + (hq + hkv) * d, ld, ld, ld};
  Prep prep;
  prep.cos = cs.data_ptr<BFloat16>();
  prep.sin = sn.data_ptr<BFloat16>();
  prep.pos = pp;
  prep.qw = qw.defined() ? qw.data_ptr<BFloat16>() : nullptr;
  prep.kw = kw.defined() ? kw.data_ptr<BFloat16>() : nullptr;
  prep.eps = static_cast<float>(eps);
  at::Tensor sc;
  if (row_scale.has_value() && row_scale->defined()) {
    TORCH_CHECK(row_scale->scalar_type() == at::kFloat && row_scale->numel() == t,
                "row_scale: float32, one per row of qkv");
    sc = row_scale->contiguous();
    prep.scale = sc.data_ptr<float>();
  }
  return attend(x, prep, t, hq, hkv, d, cu_seqlens, prefix, qkv.options());
}

}  // namespace

TORCH_LIBRARY(bounded_native, m) {
  m.def("varlen_attention_bf16(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, Tensor? prefix=None) -> Tensor");
  m.def("varlen_attention_rope_bf16(Tensor qkv, int hq, int hkv, Tensor? q_norm, Tensor? k_norm, float eps, "
        "Tensor cos, Tensor sin, Tensor positions, Tensor cu_seqlens, Tensor? prefix=None, "
        "Tensor? row_scale=None) -> Tensor");
  m.def("attention_uses_amx(int head_dim) -> bool", [](int64_t d) { return use_amx(d); });
}

TORCH_LIBRARY_IMPL(bounded_native, CPU, m) {
  m.impl("varlen_attention_bf16", &varlen_attention_bf16);
  m.impl("varlen_attention_rope_bf16", &varlen_attention_rope_bf16);
}
