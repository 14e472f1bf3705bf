// A beam step's full-vocabulary head and its choice of beams in float32, on any x86-64 CPU
// with AVX2 and FMA, with no [rows, V] logits written: the float32 counterpart of
// beam_head.cpp (bf16, AVX512-BF16), for the plans policy auto computes in float32 on a CPU
// without native bf16 (Zen 3, Ice Lake).
//
// head_gemm_summary_f32: the GEMM hidden [B, K] x weight [V, K]^T, chunk by chunk of CHUNK
// vocabulary columns split between torch's threads. The logits go to a small buffer -- a
// group of 64 columns for a block of rows where the library is built for AVX-512
// (head_summary.h, as the bf16 head's: [100, 64] x [64, 151,936] 19.9 -> 10.1 ms on two
// Emerald Rapids cores), a chunk's on AVX2 -- and are summarised there while hot: each row's
// log-sum-exp (every token, the banned ones too: the log-softmax normalises before EOS is
// banned) and the maximum of each block of BLK tokens (the banned ones -inf).
// head_choose_f32: the choice of beams from that summary (beam_choice.h), the chosen
// blocks' logits computed again by the same micro-kernel.
//
// The weight is packed once (pack_head_f32) into panels of 16 columns, [K, 16] each, so a
// micro-kernel step reads one row of a panel as two vectors; the micro-kernel is 6 rows x 16
// columns of FMA. Every logit is summed over K in the same order whatever the rows, so the
// recomputed blocks are the summary's values exactly; head_logits_f32 writes the same logits
// (a choice that reads logits; tests). Built with -mavx2 -mfma (native.py); with -mavx512f
// -mavx512dq on a CPU that has them, where a micro-kernel call takes two panels.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <immintrin.h>

#include "beam_choice.h"
#include "f32_kernels.h"
#include "head_summary.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using bounded::BLK;
using bounded::RowSum;
using bounded::f32::hsum;
using Vec = at::vec::Vectorized<float>;

constexpr int64_t PANEL = 16;   // vocabulary columns per packed panel (two vectors)
constexpr int MR = 6;           // rows per micro-kernel call
constexpr int64_t CHUNK = 256;  // columns a thread computes for a block of rows, then summarises
constexpr int64_t ROWS = 120;   // rows per block at most: ROWS x CHUNK float32 (120 KB) stay in L2
constexpr int64_t PREFETCH_BYTES = 16 << 10;  // a panel (K <= 256) chunk_logits prefetches
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

int64_t padded_columns(int64_t v) { return (v + CHUNK - 1) / CHUNK * CHUNK; }

// rows per block for b rows: as even as whole micro-kernel calls allow
int64_t block_rows(int64_t b) {
  const int64_t blocks = (b + ROWS - 1) / ROWS, per = (b + blocks - 1) / blocks;
  return std::min(ROWS, (per + MR - 1) / MR * MR);
}

// c[R, 16] (ldc) = a[R, K] (rows lda apart) x one packed panel b[K, 16]: the attentions'
// micro-kernel (f32_kernels.h) with the panel's rows PANEL apart.
template <int R>
void micro(const float* a, int64_t lda, const float* b, int64_t kdim, float* c, int64_t ldc) {
  bounded::f32::micro<R>(a, lda, b, PANEL, kdim, c, ldc);
}

using Micro = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);
constexpr std::array<Micro, MR> MICROS = {&micro<1>, &micro<2>, &micro<3>, &micro<4>, &micro<5>, &micro<6>};

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// Two neighbouring panels at once on 512-bit registers (the library's AVX-512 build): the
// same logits, bit for bit, as two calls of micro (f32_kernels.h: micro_pair).
template <int R>
void micro2(const float* a, int64_t lda, const float* b, int64_t kdim, float* c, int64_t ldc) {
  bounded::f32::micro_pair<R>(a, lda, b, b + kdim * PANEL, PANEL, kdim, c, ldc);
}
constexpr std::array<Micro, MR> PAIRS = {&micro2<1>, &micro2<2>, &micro2<3>, &micro2<4>, &micro2<5>, &micro2<6>};
constexpr int64_t STEP = 2 * PANEL;  // columns chunk_logits takes per micro-kernel call
#else
constexpr std::array<Micro, MR> PAIRS = MICROS;
constexpr int64_t STEP = PANEL;
#endif

// buf[rows, CHUNK] = the logits of `rows` hidden rows at columns [c0, c0 + CHUNK): panel by
// panel, each panel read from L2 once per 6 rows. With a small contraction a call reads its
// panel (4 KB at K = 64) too briefly for the hardware's prefetcher to run ahead, so the next
// panel is asked into L2 a share per call (as beam_head.cpp's group_logits).
void chunk_logits(const float* hidden, int64_t rows, int64_t kdim, const float* packed, int64_t c0, float* buf) {
  const int64_t bytes = kdim * STEP * static_cast<int64_t>(sizeof(float)), calls = (rows + MR - 1) / MR;
  for (int64_t col = 0; col < CHUNK; col += STEP) {  // STEP: one panel, or two on AVX-512
    const float* panel = packed + (c0 + col) / PANEL * kdim * PANEL;
    bounded::summary::Ahead ahead(panel + kdim * STEP, bytes, calls, PREFETCH_BYTES);
    for (int64_t r = 0; r < rows; r += MR) {
      ahead.ask();
      PAIRS[std::min<int64_t>(MR, rows - r) - 1](hidden + r * kdim, kdim, panel, kdim, buf + r * CHUNK + col, CHUNK);
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The AVX-512 build's summary, group by group (head_summary.h): buf[rows, 64] = the logits of
// `rows` hidden rows at the four panels from b, two micro-kernel calls of two panels each per
// 6 rows, the next group's panels asked into L2 meanwhile.
void group_logits(const float* hidden, int64_t rows, int64_t kdim, const float* b, float* buf) {
  using bounded::summary::GCOLS;
  const int64_t panel = kdim * PANEL;
  bounded::summary::Ahead ahead(b + GCOLS * kdim, GCOLS * kdim * static_cast<int64_t>(sizeof(float)),
                                (rows + MR - 1) / MR, PREFETCH_BYTES);
  for (int64_t r = 0; r < rows; r += MR) {
    ahead.ask();
    const Micro pair = PAIRS[std::min<int64_t>(MR, rows - r) - 1];
    pair(hidden + r * kdim, kdim, b, kdim, buf + r * GCOLS, GCOLS);
    pair(hidden + r * kdim, kdim, b + 2 * panel, kdim, buf + r * GCOLS + 2 * PANEL, GCOLS);
  }
}
#endif

#if !(defined(__AVX512F__) && defined(__AVX512DQ__))
// The AVX2 build's summary, chunk by chunk: a chunk's logits in buf, row by row.

inline float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

// One pass over a chunk row's n logits (n a multiple of 8, or the vocabulary's last chunk):
// the sum of exp(x - ref) into *sum, the largest of each BLK tokens into bmax, unless `sum`
// is null; -> the largest of all.
float exp_sum_blocks(const float* x, int64_t n, float ref, float* sum, float* bmax) {
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const Vec vref(ref);
  __m256 vsum = _mm256_setzero_ps();
  float most = NEG_INF;
  for (int64_t b0 = 0; b0 < n; b0 += BLK) {
    __m256 vmax = _mm256_set1_ps(NEG_INF);
    const int64_t end = std::min(n, b0 + BLK);
    for (int64_t j = b0; j < end; j += 8) {
      __m256 v = _mm256_loadu_ps(x + j);
      const __m256 in = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(end - j)), _CMP_LT_OQ);
      v = _mm256_blendv_ps(_mm256_set1_ps(NEG_INF), v, in);
      vmax = _mm256_max_ps(vmax, v);
      if (sum != nullptr) vsum = _mm256_add_ps(vsum, _mm256_and_ps((Vec(v) - vref).exp_u20(), in));
    }
    const float block = hmax(vmax);
    if (bmax != nullptr) bmax[b0 / BLK] = block;
    most = std::max(most, block);
  }
  if (sum != nullptr) *sum = hsum(vsum);
  return most;
}

// Fold one row's n logits of a chunk starting at token c0 into its sum -- against the row's
// reference, its first chunk's maximum, moved only where a later chunk exceeds it by enough
// to overflow -- and write its blocks' maxima, the banned tokens -inf.
void summarise(float* x, int64_t n, int64_t c0, RowSum& st, const int64_t* banned, int64_t nbanned, float* bmax) {
  if (st.m == NEG_INF) st.m = exp_sum_blocks(x, n, 0.0f, nullptr, nullptr);
  float sc;
  const float mc = exp_sum_blocks(x, n, st.m, &sc, bmax);
  if (mc > st.m + 64.0f) {  // e^64 x V stays far below float32's range; past it, rescale
    st.s *= std::exp(st.m - mc);
    st.m = mc;
    exp_sum_blocks(x, n, st.m, &sc, nullptr);
  }
  st.s += sc;
  bool any = false;  // the log-softmax normalises over the banned tokens; the choice never takes them
  for (int64_t e = 0; e < nbanned; ++e)
    if (banned[e] >= c0 && banned[e] < c0 + n) {
      x[banned[e] - c0] = NEG_INF;
      any = true;
    }
  if (any) exp_sum_blocks(x, n, 0.0f, nullptr, bmax);
}
#endif

bool supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

void check_inputs(const at::Tensor& hidden, const at::Tensor& packed, int64_t vocab) {
  TORCH_CHECK(supported(), "beam head: this CPU has no AVX2 and FMA");
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "beam head: hidden must be a contiguous float32 [B, K] tensor");
  const int64_t kdim = hidden.size(1);
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(0) * PANEL == padded_columns(vocab) && packed.size(1) == kdim,
              "beam head: the packed weight does not match hidden [B, ", kdim, "] and vocabulary ", vocab,
              " (pack it with pack_head_f32)");
}

// weight [V, K] float32 -> [V' / 16, K, 16]: panels of 16 columns, V padded with zero columns
// to whole chunks (V').
at::Tensor pack_head_f32(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "pack_head_f32: a float32 [V, K] weight");
  const at::Tensor w = weight.contiguous();
  const int64_t v = w.size(0), kdim = w.size(1), panels = padded_columns(v) / PANEL;
  at::Tensor out = at::zeros({panels, kdim, PANEL}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, panels, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t j = 0; j < PANEL && p * PANEL + j < v; ++j) {
        const float* row = src + (p * PANEL + j) * kdim;
        for (int64_t kk = 0; kk < kdim; ++kk) dst[(p * kdim + kk) * PANEL + j] = row[kk];
      }
  });
  return out;
}

// The logits [B, vocab] float32, exactly as head_gemm_summary_f32 and head_choose_f32 see them.
at::Tensor head_logits_f32(const at::Tensor& hidden, const at::Tensor& packed, int64_t vocab) {
  check_inputs(hidden, packed, vocab);
  const int64_t b = hidden.size(0), kdim = hidden.size(1), cols = padded_columns(vocab), step = block_rows(b);
  at::Tensor out = at::empty({b, vocab}, hidden.options());
  float* o = out.data_ptr<float>();
  const float* h = hidden.data_ptr<float>();
  at::parallel_for(0, cols / CHUNK, 1, [&](int64_t c_begin, int64_t c_end) {
    std::vector<float> buf(step * CHUNK);
    for (int64_t c = c_begin; c < c_end; ++c)
      for (int64_t r0 = 0; r0 < b; r0 += step) {
        const int64_t rows = std::min(step, b - r0), n = std::min(CHUNK, vocab - c * CHUNK);
        chunk_logits(h + r0 * kdim, rows, kdim, packed.data_ptr<float>(), c * CHUNK, buf.data());
        for (int64_t r = 0; r < rows; ++r) std::copy(buf.data() + r * CHUNK, buf.data() + r * CHUNK + n,
                                                     o + (r0 + r) * vocab + c * CHUNK);
      }
  });
  return out;
}

// The head GEMM with its epilogue: hidden [B, K] float32, packed (pack_head_f32), banned [E]
// int64 ids -> (lse [B] float32: each row's log-sum-exp over every token, the banned ones
// included; block_max [B, ceil(vocab / BLK)] float32: each block's largest logit, the banned
// ones -inf). The logits themselves are written nowhere.
std::tuple<at::Tensor, at::Tensor> head_gemm_summary_f32(const at::Tensor& hidden, const at::Tensor& packed,
                                                         int64_t vocab, const at::Tensor& banned) {
  check_inputs(hidden, packed, vocab);
  const at::Tensor ban = bounded::banned_ids(banned);
  const int64_t nbanned = ban.numel(), b = hidden.size(0), kdim = hidden.size(1);
  const int64_t* bp = ban.data_ptr<int64_t>();
  const float* pk = packed.data_ptr<float>();
  const float* h = hidden.data_ptr<float>();
  const int64_t chunks = padded_columns(vocab) / CHUNK, nb = (vocab + BLK - 1) / BLK, step = block_rows(b);
  at::Tensor lse = at::empty({b}, hidden.options());
  at::Tensor bmax = at::empty({b, nb}, lse.options());
  float* bm = bmax.data_ptr<float>();
  // the chunks in fixed slabs (bounded::each_share), each slab's sums merged in slab order
  const int64_t slabs = std::min<int64_t>(bounded::SLABS, chunks);
  std::vector<std::vector<RowSum>> sums(slabs, std::vector<RowSum>(b));
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  bounded::each_share(chunks, slabs, [&] { return 0; }, [&](int64_t slab, int64_t c0, int64_t c1, int) {
    bounded::summary::FusedSums fs(b, step);
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t r0 = 0; r0 < b; r0 += step) {
        const int64_t rows = std::min(step, b - r0);
        bounded::summary::chunk_summary(
            [&](int64_t g0, float* buf) { group_logits(h + r0 * kdim, rows, kdim, pk + g0 / PANEL * kdim * PANEL, buf); },
            r0, rows, c * CHUNK, CHUNK, vocab, bp, nbanned, fs, bm, nb);
      }
    for (int64_t r = 0; r < b; ++r) sums[slab][r] = fs.row(r);
  });
#else
  bounded::each_share(chunks, slabs, [&] { return std::vector<float>(step * CHUNK); },
                     [&](int64_t slab, int64_t c0, int64_t c1, std::vector<float>& buf) {
    auto& mine = sums[slab];
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t r0 = 0; r0 < b; r0 += step) {
        const int64_t rows = std::min(step, b - r0), n = std::min(CHUNK, vocab - c * CHUNK);
        chunk_logits(h + r0 * kdim, rows, kdim, pk, c * CHUNK, buf.data());
        for (int64_t r = 0; r < rows; ++r)
          summarise(buf.data() + r * CHUNK, n, c * CHUNK, mine[r0 + r], bp, nbanned, bm + (r0 + r) * nb + c * (CHUNK / BLK));
      }
  });
#endif
  bounded::merge_sums(sums, b, lse.data_ptr<float>());
  return {lse, bmax};
}

// The choice of beams from the summary (beam_choice.h): hidden [R * W, K], packed, banned as
// above, lse and block_max (head_gemm_summary_f32 of the same rows), cum [R, W] float32 ->
// scores [R, k], parent rows within the request [R, k], tokens [R, k].
std::tuple<at::Tensor, at::Tensor, at::Tensor> head_choose_f32(const at::Tensor& hidden, const at::Tensor& packed,
                                                               int64_t vocab, const at::Tensor& banned,
                                                               const at::Tensor& lse, const at::Tensor& block_max,
                                                               const at::Tensor& cum, int64_t k) {
  check_inputs(hidden, packed, vocab);
  const int64_t kdim = hidden.size(1);
  const float* h = hidden.data_ptr<float>();
  const float* pk = packed.data_ptr<float>();
  return bounded::choose(vocab, banned, lse, block_max, cum, k, hidden.size(0), "head_gemm_summary_f32",
                         [] { return 0; },
                         [&](int64_t row, int64_t c0, float* x) {
                           for (int64_t col = 0; col < BLK; col += PANEL)
                             micro<1>(h + row * kdim, kdim, pk + (c0 + col) / PANEL * kdim * PANEL, kdim, x + col, BLK);
                         });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bounded_native_f32, m) {
  m.def("pack_head_f32(Tensor weight) -> Tensor");
  m.def("head_logits_f32(Tensor hidden, Tensor packed, int vocab) -> Tensor");
  m.def("head_gemm_summary_f32(Tensor hidden, Tensor packed, int vocab, Tensor banned) -> (Tensor, Tensor)");
  m.def("head_choose_f32(Tensor hidden, Tensor packed, int vocab, Tensor banned, Tensor lse, Tensor block_max, "
        "Tensor cum, int k) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bounded_native_f32, CPU, m) {
  m.impl("pack_head_f32", &pack_head_f32);
  m.impl("head_logits_f32", &head_logits_f32);
  m.impl("head_gemm_summary_f32", &head_gemm_summary_f32);
  m.impl("head_choose_f32", &head_choose_f32);
}
