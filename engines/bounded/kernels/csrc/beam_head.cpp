// A beam step's full-vocabulary head and its choice of beams, on a CPU with AVX512-BF16,
// with no [rows, V] logits written anywhere.
//
// head_gemm_summary_bf16: the GEMM hidden [B, K] x weight [V, K]^T, chunk by chunk of CHUNK
// vocabulary columns, in fixed slabs of chunks that torch's threads take one at a time (the
// same sums whatever the threads). The logits (float32 sums of bf16
// products, rounded to bf16 as a bf16 GEMM's output is) go to a small buffer -- a group of
// 64 columns for a block of rows (AVX512-BF16), a chunk (AMX) -- and are summarised there
// while hot: each row's log-sum-exp (every token, the banned ones too: the log-softmax
// normalises before EOS is banned) and the maximum of each block of BLK tokens (the banned
// ones -inf).
//
// head_choose_bf16: log p(t | b) = logit - lse[b], a per-row shift, so a block's best
// continuation scores cum[b] + (block_max - lse[b]) exactly, and a request's best k
// continuations lie in its best k blocks. Those blocks' logits are computed again (the same
// products in the same order, the same values) and their best k are the answer: the exact
// top-k of W x V continuations from k x BLK candidates.
//
// The weight is packed once (pack_head_bf16) into panels of 16 columns holding pairs along
// the contraction, the layout of the dot-product instruction; the micro-kernel is 6 rows x
// 64 columns. head_logits_bf16 writes the same logits, value for value (a choice that reads
// logits: an item trie; tests).
//
// On a CPU with AMX (and the kernel's leave to use it: amx_permitted) the same panels are AMX
// tiles' B operand as they stand -- 16 pairs of K by 16 columns, 64-byte rows -- and the
// logits come from tile dot products (a 32 x 32 block per call, 16-row tiles; rows padded with
// zeros to whole tiles) instead: about five times the rate, so the GEMM streams the weight at
// memory speed. Every logit is summed over K in the same order whatever the rows or the
// block, in both forms, so the choice's recomputed blocks are the summary's values exactly;
// which form serves is fixed per process (use_amx).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <immintrin.h>

#include "amx_tiles.h"
#include "beam_choice.h"
#include "head_summary.h"
#include "lean_exp.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using at::BFloat16;
using Vec = at::vec::Vectorized<float>;

#define HEAD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

constexpr int64_t PANEL = 16;   // vocabulary columns per packed panel (one vector)
constexpr int GROUP = 4;        // panels per micro-kernel call: 64 columns
constexpr int MR = 6;           // rows per micro-kernel call
constexpr int64_t CHUNK = 512;  // columns a thread computes for a block of rows, then summarises
// a chunk buffer's row stride: a 2 KB stride put a tile's 16 rows in two L1 sets
constexpr int64_t LDC = CHUNK + 16;
constexpr int64_t PREFETCH_BYTES = 16 << 10;  // a group's panels (K <= 128) the summary prefetches
constexpr int64_t ROWS = 120;   // rows per block at most: ROWS x CHUNK float32 (240 KB) stay in L2

// rows per block for b rows: as even as whole micro-kernel calls allow (100 rows: one block,
// not 48 + 48 + 4, whose last pass over the weight would feed 4 rows)
int64_t block_rows(int64_t b) {
  const int64_t blocks = (b + ROWS - 1) / ROWS, per = (b + blocks - 1) / blocks;
  return std::min(ROWS, (per + MR - 1) / MR * MR);
}

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

using bounded::BLK;
using bounded::RowSum;

int64_t padded_columns(int64_t v) { return (v + CHUNK - 1) / CHUNK * CHUNK; }

using bounded::LOG2E;
using bounded::summary::FusedSums;
using bounded::summary::lanes;

// float32 -> the nearest bf16 (ties to even), widened back to float32 exactly.
HEAD_TARGET inline __m512 round_bf16(__m512 x) {
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// c[M, 64] (ldc) = bf16(a[M, 2 k2] (lda) x the 4 panels at b (each k2 x 16 pairs, `panel` apart)).
// Every output lane sums its K products in the same order whatever M is. Inlined into a loop
// over rows (group_logits) its accumulators stay in registers; beside the summary's
// constants gcc kept them on the stack.
template <int M>
HEAD_TARGET __attribute__((always_inline)) inline void micro_inline(const BFloat16* a, int64_t lda, const BFloat16* b,
                                                                    int64_t panel, int64_t k2, float* c, int64_t ldc) {
  __m512 acc[M][GROUP];
  for (int r = 0; r < M; ++r)
    for (int g = 0; g < GROUP; ++g) acc[r][g] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t kk = 0; kk < k2; ++kk) {
    __m512bh bv[GROUP];
    for (int g = 0; g < GROUP; ++g) bv[g] = (__m512bh)_mm512_loadu_si512(b + g * panel + kk * 2 * PANEL);
    for (int r = 0; r < M; ++r) {
      int32_t word;
      std::memcpy(&word, a + r * lda + 2 * kk, sizeof(word));
      const __m512bh av = (__m512bh)_mm512_set1_epi32(word);
      for (int g = 0; g < GROUP; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], av, bv[g]);
    }
  }
  for (int r = 0; r < M; ++r)
    for (int g = 0; g < GROUP; ++g) _mm512_storeu_ps(c + r * ldc + g * PANEL, round_bf16(acc[r][g]));
}

template <int M>
HEAD_TARGET void micro(const BFloat16* a, int64_t lda, const BFloat16* b, int64_t panel, int64_t k2, float* c,
                       int64_t ldc) {
  micro_inline<M>(a, lda, b, panel, k2, c, ldc);
}

using Micro = void (*)(const BFloat16*, int64_t, const BFloat16*, int64_t, int64_t, float*, int64_t);
constexpr Micro MICROS[MR] = {&micro<1>, &micro<2>, &micro<3>, &micro<4>, &micro<5>, &micro<6>};

// buf[rows, CHUNK] (row stride LDC) = the logits of hidden rows [0, rows) (ld `kdim`) at columns [c0, c0 + CHUNK).
HEAD_TARGET void chunk_logits(const BFloat16* hidden, int64_t rows, int64_t kdim, const BFloat16* packed, int64_t c0,
                              float* buf) {
  const int64_t k2 = kdim / 2, panel = k2 * 2 * PANEL;
  for (int64_t col = 0; col < CHUNK; col += GROUP * PANEL) {
    const BFloat16* b = packed + (c0 + col) / PANEL * panel;
    for (int64_t r = 0; r < rows; r += MR) {
      const int64_t m = std::min<int64_t>(MR, rows - r);
      MICROS[m - 1](hidden + r * kdim, kdim, b, panel, k2, buf + r * LDC + col, LDC);
    }
  }
}

// --- the AVX512-BF16 form's summary, group by group ---------------------------------------
//
// The logits of a group of 64 columns for every row of a block (a loop of micro-kernels,
// inlined, rounded to bf16 as micro's) go to a small buffer and are summarised from there
// at once (head_summary.h). Zen 4, [100, 64] x [64, 151,936] on two threads: 9.1 -> ~6 ms.

// buf[rows, 64] = the logits of hidden rows [0, rows) (ld kdim) at one group (panels at b)
HEAD_TARGET void group_logits(const BFloat16* hidden, int64_t rows, int64_t kdim, const BFloat16* b, float* buf) {
  const int64_t k2 = kdim / 2, panel = k2 * 2 * PANEL, ld = GROUP * PANEL;
  bounded::summary::Ahead ahead(b + GROUP * panel, GROUP * panel * static_cast<int64_t>(sizeof(BFloat16)),
                                (rows + MR - 1) / MR, PREFETCH_BYTES);
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) {
    ahead.ask();
    micro_inline<MR>(hidden + r * kdim, kdim, b, panel, k2, buf + r * ld, ld);
  }
  ahead.ask();
  const BFloat16* a = hidden + r * kdim;
  float* out = buf + r * ld;
  switch (rows - r) {
    case 1: micro_inline<1>(a, kdim, b, panel, k2, out, ld); break;
    case 2: micro_inline<2>(a, kdim, b, panel, k2, out, ld); break;
    case 3: micro_inline<3>(a, kdim, b, panel, k2, out, ld); break;
    case 4: micro_inline<4>(a, kdim, b, panel, k2, out, ld); break;
    case 5: micro_inline<5>(a, kdim, b, panel, k2, out, ld); break;
    default: break;
  }
}

// Rows [r0, r0 + rows) at the chunk's columns [c0, c0 + CHUNK) into the thread's sums, and
// their blocks' maxima into bm [B, nb].
HEAD_TARGET void chunk_summary(const BFloat16* hidden, int64_t r0, int64_t rows, int64_t kdim, const BFloat16* packed,
                               int64_t c0, int64_t vocab, const int64_t* ban, int64_t nbanned, FusedSums& fs,
                               float* bm, int64_t nb) {
  static_assert(CHUNK % BLK == 0 && GROUP * PANEL == bounded::summary::GCOLS, "a chunk is whole blocks of two groups");
  const int64_t panel = kdim / 2 * 2 * PANEL;
  bounded::summary::chunk_summary(
      [&](int64_t g0, float* buf) { group_logits(hidden + r0 * kdim, rows, kdim, packed + g0 / PANEL * panel, buf); },
      r0, rows, c0, CHUNK, vocab, ban, nbanned, fs, bm, nb);
}

// --- the AMX form -----------------------------------------------------------------------

// which form serves is fixed per process: AMX where amx_tiles.h allows it (BOUNDED_HEAD_AMX=0
// keeps the AVX512-BF16 form, to compare the two)
bool amx_permitted() {
  static const bool ok = bounded::amx_permitted("BOUNDED_HEAD_AMX");
  return ok;
}

constexpr int64_t KT = 32;        // K per tile step: 16 pairs, a 64-byte tile row
constexpr int64_t TILE_ROWS = 16;

// the AMX form serves a contraction of whole tile steps
bool use_amx(int64_t kdim) { return kdim % KT == 0 && amx_permitted(); }

using bounded::Tiles;

// c[RT tiles of rows, 32 columns] (ldc floats, not rounded) = a (RT x 16 rows, lda apart)
// x the 2 panels at b (`panel` apart), over kt steps of KT
template <int RT>
AMX_TARGET void amx_block(const BFloat16* a, int64_t lda, const BFloat16* b, int64_t panel, int64_t kt, float* c,
                          int64_t ldc) {
  constexpr int64_t E = sizeof(BFloat16);
  bounded::tile_product<RT, 2>(a, lda * E, b, panel * E, KT * PANEL * E, 2 * PANEL * E, kt, c, ldc);
}

// x[0:n] = bf16(x[0:n]), in float32
HEAD_TARGET void round_row(float* x, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = lanes(j, n);
    _mm512_mask_storeu_ps(x + j, m, round_bf16(_mm512_maskz_loadu_ps(m, x + j)));
  }
}

// As chunk_logits, from tiles (configured for 16 rows): `rows` a multiple of 16 (hidden
// padded); the sums not yet rounded to bf16 (their readers round them: summarise, and the
// bf16 conversion in head_logits_bf16).
AMX_TARGET void chunk_logits_amx(const BFloat16* hidden, int64_t rows, int64_t kdim, const BFloat16* packed, int64_t c0,
                                 float* buf) {
  const int64_t panel = kdim / 2 * 2 * PANEL;
  // at a small contraction the next two panels are asked into L2 a share per call, as
  // group_logits does (a call reads its 2 x 2 KB at K = 64 too briefly for the prefetcher)
  const int64_t bytes = 2 * panel * static_cast<int64_t>(sizeof(BFloat16)), calls = (rows + 2 * TILE_ROWS - 1) / (2 * TILE_ROWS);
  for (int64_t col = 0; col < CHUNK; col += 2 * PANEL) {
    const BFloat16* b = packed + (c0 + col) / PANEL * panel;
    bounded::summary::Ahead ahead(b + 2 * panel, bytes, calls, PREFETCH_BYTES);
    int64_t r = 0;
    for (; r + 2 * TILE_ROWS <= rows; r += 2 * TILE_ROWS) {
      ahead.ask();
      amx_block<2>(hidden + r * kdim, kdim, b, panel, kdim / KT, buf + r * LDC + col, LDC);
    }
    ahead.ask();
    if (r < rows) amx_block<1>(hidden + r * kdim, kdim, b, panel, kdim / KT, buf + r * LDC + col, LDC);
  }
}

// One row's logits at columns [c0, c0 + n) (n a multiple of 32) into x, from tiles configured
// for 1 row: the values chunk_logits_amx gives that row.
AMX_TARGET void row_logits_amx(const BFloat16* row, int64_t kdim, const BFloat16* packed, int64_t c0, int64_t n,
                               float* x) {
  const int64_t panel = kdim / 2 * 2 * PANEL, bytes = 2 * panel * static_cast<int64_t>(sizeof(BFloat16));
  for (int64_t col = 0; col < n; col += 2 * PANEL) {
    const BFloat16* b = packed + (c0 + col) / PANEL * panel;
    if (bytes <= PREFETCH_BYTES)  // the next two panels, as chunk_logits_amx
      for (int64_t line = 0; line < bytes / 64; ++line)
        _mm_prefetch(reinterpret_cast<const char*>(b + 2 * panel) + line * 64, _MM_HINT_T1);
    amx_block<1>(row, kdim, b, panel, kdim / KT, x + col, n);
  }
  round_row(x, n);
}

// The form that computes a call's logits: hidden rows as given (AVX512-BF16), or copied into
// whole 16-row tiles (AMX), the thread's tiles configured while it lives.
struct Logits {
  bool amx;
  at::Tensor padded;  // AMX: hidden with zero rows to a multiple of 16
  const BFloat16* h;
  int64_t rows, kdim, step;  // rows per block of the chunk loop

  Logits(const at::Tensor& hidden) : amx(use_amx(hidden.size(1))), rows(hidden.size(0)), kdim(hidden.size(1)) {
    if (amx) {
      const int64_t tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
      padded = at::zeros({tiles * TILE_ROWS, kdim}, hidden.options());
      padded.narrow(0, 0, rows).copy_(hidden);
      h = padded.data_ptr<BFloat16>();
      // blocks of at most 112 rows (7 tiles: 112 x CHUNK float32 stay in L2), as even as tiles allow
      const int64_t most = 7 * TILE_ROWS, blocks = (rows + most - 1) / most, per = (rows + blocks - 1) / blocks;
      step = (per + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
    } else {
      h = hidden.data_ptr<BFloat16>();
      step = block_rows(rows);
    }
  }
  // buf[n, CHUNK] = the logits of rows [r0, r0 + n) at [c0, c0 + CHUNK); n <= step
  void chunk(int64_t r0, int64_t n, const BFloat16* packed, int64_t c0, float* buf) const {
    if (amx)
      chunk_logits_amx(h + r0 * kdim, (n + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS, kdim, packed, c0, buf);
    else
      chunk_logits(h + r0 * kdim, n, kdim, packed, c0, buf);
  }
  // a buffer for `chunk`: whole tiles of rows
  int64_t buffer_rows() const { return amx ? (step + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS : step; }
};

// One pass over a chunk row's n logits, each rounded to bf16 as it is read (a no-op where the
// AVX512-BF16 form stored them rounded): with SUM the sum of exp(x - ref) into *sum, the
// largest of each BLK tokens (the last block may be short) into bmax unless it is null; ->
// the largest of all. A whole block is read as 4 pairs of vectors, each pair rounded by one
// conversion into 32 bf16 and widened back in two unpacks (the lanes permuted within each
// 128-bit lane: a sum and a maximum do not mind), with two sums and two maxima, unmasked:
// the loop was bound by its one sum's latency and the per-vector masks (~10 cycles a vector
// where its instructions need ~6). Only a short last block takes the masked loop.
template <bool SUM>
HEAD_TARGET float exp_sum_blocks(const float* x, int64_t n, float ref, float* sum, float* bmax) {
  const __m512 l2e = _mm512_set1_ps(LOG2E), shift = _mm512_set1_ps(ref * LOG2E), neg = _mm512_set1_ps(NEG_INF);
  const __m512i zero = _mm512_setzero_si512();
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  float most = NEG_INF;
  for (int64_t b0 = 0; b0 < n; b0 += BLK) {
    const int64_t end = std::min(n, b0 + BLK);
    __m512 m0 = neg, m1 = neg;
    if (end - b0 == BLK) {
      for (int64_t j = b0; j < end; j += 32) {
        const __m512i p = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + j + 16), _mm512_loadu_ps(x + j));
        const __m512 lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, p));
        const __m512 hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, p));
        m0 = _mm512_max_ps(m0, lo);
        m1 = _mm512_max_ps(m1, hi);
        if (SUM) {
          s0 = _mm512_add_ps(s0, bounded::exp2_lean(_mm512_fmsub_ps(lo, l2e, shift)));
          s1 = _mm512_add_ps(s1, bounded::exp2_lean(_mm512_fmsub_ps(hi, l2e, shift)));
        }
      }
    } else {
      for (int64_t j = b0; j < end; j += 16) {
        const __mmask16 m = lanes(j, end);
        const __m512 v = round_bf16(_mm512_maskz_loadu_ps(m, x + j));
        m0 = _mm512_mask_max_ps(m0, m, m0, v);
        if (SUM) s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(m, bounded::exp2_lean(_mm512_fmsub_ps(v, l2e, shift))));
      }
    }
    const float block = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    if (bmax != nullptr) bmax[b0 / BLK] = block;
    most = std::max(most, block);
  }
  if (SUM) *sum = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  return most;
}

// Fold one row's n logits of a chunk starting at token c0 into its sum -- against the row's
// reference, its first chunk's maximum, moved only where a later chunk exceeds it by enough
// to overflow -- and write its blocks' maxima, the banned tokens -inf.
HEAD_TARGET void summarise(float* x, int64_t n, int64_t c0, RowSum& st, const int64_t* banned, int64_t nbanned,
                           float* bmax) {
  if (st.m == NEG_INF) st.m = exp_sum_blocks<false>(x, n, 0.0f, nullptr, nullptr);
  float sc;
  const float mc = exp_sum_blocks<true>(x, n, st.m, &sc, bmax);
  if (mc > st.m + 64.0f) {  // e^64 x V stays far below float32's range; past it, rescale
    st.s *= std::exp(st.m - mc);
    st.m = mc;
    exp_sum_blocks<true>(x, n, st.m, &sc, nullptr);
  }
  st.s += sc;
  bool any = false;  // the log-softmax normalises over the banned tokens; the choice never takes them
  for (int64_t e = 0; e < nbanned; ++e)
    if (banned[e] >= c0 && banned[e] < c0 + n) {
      x[banned[e] - c0] = NEG_INF;
      any = true;
    }
  if (any) exp_sum_blocks<false>(x, n, 0.0f, nullptr, bmax);
}

void check_inputs(const at::Tensor& hidden, const at::Tensor& packed, int64_t vocab) {
  TORCH_CHECK(__builtin_cpu_supports("avx512bf16"), "beam head: this CPU has no AVX512-BF16");
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kBFloat16 && hidden.is_contiguous(),
              "beam head: hidden must be a contiguous bf16 [B, K] tensor");
  const int64_t kdim = hidden.size(1);
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() && packed.dim() == 4 &&
                  packed.size(0) * PANEL == padded_columns(vocab) && packed.size(1) * 2 == kdim,
              "beam head: the packed weight does not match hidden [B, ", kdim, "] and vocabulary ", vocab,
              " (pack it with pack_head_bf16)");
}

// weight [V, K] bf16 -> [V' / 16, K / 2, 16, 2]: panels of 16 columns, pairs along K, V
// padded with zero columns to whole chunks (V').
at::Tensor pack_head_bf16(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "pack_head_bf16: a bf16 [V, K] weight");
  TORCH_CHECK(weight.size(1) % 2 == 0, "pack_head_bf16: K must be even, got ", weight.size(1));
  const at::Tensor w = weight.contiguous();
  const int64_t v = w.size(0), kdim = w.size(1), k2 = kdim / 2, panels = padded_columns(v) / PANEL;
  at::Tensor out = at::zeros({panels, k2, PANEL, 2}, w.options());
  const BFloat16* src = w.data_ptr<BFloat16>();
  BFloat16* dst = out.data_ptr<BFloat16>();
  at::parallel_for(0, panels, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t j = 0; j < PANEL && p * PANEL + j < v; ++j) {
        const BFloat16* row = src + (p * PANEL + j) * kdim;
        for (int64_t kk = 0; kk < k2; ++kk) {
          BFloat16* d = dst + ((p * k2 + kk) * PANEL + j) * 2;
          d[0] = row[2 * kk];
          d[1] = row[2 * kk + 1];
        }
      }
  });
  return out;
}

// The logits [B, vocab] bf16, exactly as head_gemm_summary_bf16 and head_choose_bf16 see them.
at::Tensor head_logits_bf16(const at::Tensor& hidden, const at::Tensor& packed, int64_t vocab) {
  check_inputs(hidden, packed, vocab);
  const int64_t b = hidden.size(0), cols = padded_columns(vocab);
  at::Tensor out = at::empty({b, vocab}, hidden.options());
  BFloat16* o = out.data_ptr<BFloat16>();
  const Logits logits(hidden);
  const int64_t step = logits.step;
  at::parallel_for(0, cols / CHUNK, 1, [&](int64_t c_begin, int64_t c_end) {
    const Tiles tiles(logits.amx, TILE_ROWS);
    std::vector<float> buf(logits.buffer_rows() * LDC);
    for (int64_t c = c_begin; c < c_end; ++c)
      for (int64_t r0 = 0; r0 < b; r0 += step) {
        const int64_t rows = std::min(step, b - r0), n = std::min(CHUNK, vocab - c * CHUNK);
        logits.chunk(r0, rows, packed.data_ptr<BFloat16>(), c * CHUNK, buf.data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < n; ++j) o[(r0 + r) * vocab + c * CHUNK + j] = BFloat16(buf[r * LDC + j]);
      }
  });
  return out;
}

// The head GEMM with its epilogue: hidden [B, K] bf16, packed (pack_head_bf16), banned [E]
// int64 ids -> (lse [B] float32: each row's log-sum-exp over every token, the banned ones
// included; block_max [B, ceil(vocab / BLK)] float32: each block's largest logit, the banned
// ones -inf). The logits themselves are written nowhere.
std::tuple<at::Tensor, at::Tensor> head_gemm_summary_bf16(const at::Tensor& hidden, const at::Tensor& packed,
                                                          int64_t vocab, const at::Tensor& banned) {
  check_inputs(hidden, packed, vocab);
  const at::Tensor ban = bounded::banned_ids(banned);
  const int64_t nbanned = ban.numel(), b = hidden.size(0);
  const int64_t* bp = ban.data_ptr<int64_t>();
  const BFloat16* pk = packed.data_ptr<BFloat16>();
  const int64_t chunks = padded_columns(vocab) / CHUNK, nb = (vocab + BLK - 1) / BLK;
  at::Tensor lse = at::empty({b}, hidden.options().dtype(at::kFloat));
  at::Tensor bmax = at::empty({b, nb}, lse.options());
  float* bm = bmax.data_ptr<float>();
  // the chunks in fixed slabs, each slab's sums merged in slab order after: the same lse
  // whatever the threads, and a thread that finishes early takes the next slab (on a shared
  // machine a static half each left one thread waiting on the other's slower half)
  const int64_t slabs = std::min<int64_t>(bounded::SLABS, chunks);
  std::vector<std::vector<RowSum>> sums(slabs, std::vector<RowSum>(b));
  const Logits logits(hidden);
  const int64_t step = logits.step;
  if (!logits.amx) {  // the AVX512-BF16 form: group by group
    const int64_t kdim = hidden.size(1);
    bounded::each_share(chunks, slabs, [&] { return 0; }, [&](int64_t slab, int64_t c0, int64_t c1, int) {
      FusedSums fs(b, step);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r0 = 0; r0 < b; r0 += step)
          chunk_summary(logits.h, r0, std::min(step, b - r0), kdim, pk, c * CHUNK, vocab, bp, nbanned, fs, bm, nb);
      for (int64_t r = 0; r < b; ++r) sums[slab][r] = fs.row(r);
    });
    bounded::merge_sums(sums, b, lse.data_ptr<float>());
    return {lse, bmax};
  }
  struct Worker {
    Tiles tiles;
    std::vector<float> buf;
    explicit Worker(const Logits& l) : tiles(l.amx, TILE_ROWS), buf(l.buffer_rows() * LDC) {}
  };
  bounded::each_share(chunks, slabs, [&] { return Worker(logits); },  // built in place: Tiles do not move
                     [&](int64_t slab, int64_t c0, int64_t c1, Worker& w) {
    auto& mine = sums[slab];
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t r0 = 0; r0 < b; r0 += step) {
        const int64_t rows = std::min(step, b - r0), n = std::min(CHUNK, vocab - c * CHUNK);
        logits.chunk(r0, rows, pk, c * CHUNK, w.buf.data());
        for (int64_t r = 0; r < rows; ++r)
          summarise(w.buf.data() + r * LDC, n, c * CHUNK, mine[r0 + r], bp, nbanned,
                    bm + (r0 + r) * nb + c * (CHUNK / BLK));
      }
  });
  bounded::merge_sums(sums, b, lse.data_ptr<float>());
  return {lse, bmax};
}

// The choice of beams from the summary (beam_choice.h): hidden [R * W, K], packed, banned as
// above, lse and block_max (head_gemm_summary_bf16 of the same rows), cum [R, W] float32 ->
// each request's best k continuations cum + (logit - lse), best first: scores [R, k]
// float32 (-inf: none), parent row within the request [R, k], token [R, k] int64. Only the
// chosen blocks' logits are computed again, value for value as before.
std::tuple<at::Tensor, at::Tensor, at::Tensor> head_choose_bf16(const at::Tensor& hidden, const at::Tensor& packed,
                                                                int64_t vocab, const at::Tensor& banned,
                                                                const at::Tensor& lse, const at::Tensor& block_max,
                                                                const at::Tensor& cum, int64_t k) {
  check_inputs(hidden, packed, vocab);
  const int64_t kdim = hidden.size(1), panel = kdim / 2 * 2 * PANEL;
  const BFloat16* h = hidden.data_ptr<BFloat16>();
  const BFloat16* pk = packed.data_ptr<BFloat16>();
  const bool amx = use_amx(kdim);
  return bounded::choose(vocab, banned, lse, block_max, cum, k, hidden.size(0), "head_gemm_summary_bf16",
                         [&] { return Tiles(amx, 1); },
                         [&](int64_t row, int64_t c0, float* x) {
                           if (amx)
                             row_logits_amx(h + row * kdim, kdim, pk, c0, BLK, x);
                           else
                             for (int64_t col = 0; col < BLK; col += GROUP * PANEL)
                               micro<1>(h + row * kdim, kdim, pk + (c0 + col) / PANEL * panel, panel, kdim / 2, x + col, BLK);
                         });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bounded_native, m) {
  m.def("pack_head_bf16(Tensor weight) -> Tensor");
  m.def("head_uses_amx(int hidden) -> bool", [](int64_t hidden) { return use_amx(hidden); });
  m.def("head_logits_bf16(Tensor hidden, Tensor packed, int vocab) -> Tensor");
  m.def("head_gemm_summary_bf16(Tensor hidden, Tensor packed, int vocab, Tensor banned) -> (Tensor, Tensor)");
  m.def("head_choose_bf16(Tensor hidden, Tensor packed, int vocab, Tensor banned, Tensor lse, Tensor block_max, "
        "Tensor cum, int k) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bounded_native, CPU, m) {
  m.impl("pack_head_bf16", &pack_head_bf16);
  m.impl("head_logits_bf16", &head_logits_bf16);
  m.impl("head_gemm_summary_bf16", &head_gemm_summary_bf16);
  m.impl("head_choose_bf16", &head_choose_bf16);
}
