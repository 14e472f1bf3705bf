// The fused beam heads' summary on 512-bit registers, whatever computes the logits: shared by
// the bf16 head's AVX512-BF16 form (beam_head.cpp) and the float32 head where its library is
// built for AVX-512 (beam_head_f32.cpp).
//
// The logits of a group of 64 columns for every row of a block go to a small buffer and are
// summarised from there at once, with lean_exp.h's exponential: with a small contraction
// (the tiny models' K = 64) a chunk buffer's round trip through L2 and ATen's exp_u20 cost
// about as much as the products. Each row's log-sum-exp (every token, the banned ones too)
// and the maximum of each block of BLK tokens (the banned ones -inf), as beam_choice.h reads
// them; the summary is there where the including file is built with -mavx512f -mavx512dq
// (native.py), the prefetch helper (Ahead) everywhere.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "beam_choice.h"

namespace bounded::summary {

// With a small contraction a micro-kernel call reads its panels (a few KB at K = 64) too
// briefly for the hardware's prefetcher to run ahead, and each group's first call waited on
// memory: the next group's panels (`bytes` at `next`) are asked into L2 a share per call, over
// `calls` calls. (Large K, past `limit` bytes: long streams the prefetcher follows; asking as
// well cost ~3 % at K = 896.)
class Ahead {
 public:
  Ahead(const void* next, int64_t bytes, int64_t calls, int64_t limit)
      : next_(static_cast<const char*>(next)), lines_(bytes <= limit ? bytes / 64 : 0),
        per_((lines_ + std::max<int64_t>(1, calls) - 1) / std::max<int64_t>(1, calls)) {}
  void ask() {
    for (const int64_t end = std::min(lines_, line_ + per_); line_ < end; ++line_)
      _mm_prefetch(next_ + line_ * 64, _MM_HINT_T1);
  }

 private:
  const char* next_;
  int64_t lines_, per_, line_ = 0;
};

}  // namespace bounded::summary

#if defined(__AVX512F__) && defined(__AVX512DQ__)

#include "lean_exp.h"

namespace bounded::summary {

constexpr int64_t PANEL = 16;           // columns per vector
constexpr int GROUP = 4;                // vectors per group
constexpr int64_t GCOLS = GROUP * PANEL;  // columns per group: 64, two to a block
static_assert(BLK == 2 * GCOLS, "a block is two groups");

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// lanes j..n-1 of 16 (all where n - j >= 16)
inline __mmask16 lanes(int64_t j, int64_t n) {
  const int64_t left = n - j;
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// One thread's running summary of the rows it has seen columns of: ref[r] near the row's
// maximum so far (-inf: none yet), lanes[r] 16 lanes of sum exp(x - ref[r]), halves[r] 16
// lanes of the maxima of the block's first group; buf a group's logits [step, 64].
struct FusedSums {
  std::vector<float> ref, lanes, halves, buf;
  FusedSums(int64_t rows, int64_t step)
      : ref(rows, NEG_INF), lanes(rows * 16, 0.0f), halves(rows * 16, 0.0f), buf(step * GCOLS) {}
  RowSum row(int64_t r) const { return {ref[r], _mm512_reduce_add_ps(_mm512_loadu_ps(lanes.data() + r * 16))}; }
};

// The lanes of one group: `valid` (inside the vocabulary) and `keep` (valid, not banned: the
// block maxima's lanes); `banned`: keep != valid somewhere.
struct GroupMasks {
  __mmask16 valid[GROUP], keep[GROUP];
  bool banned;
};

inline GroupMasks group_masks(int64_t c0, int64_t vocab, const int64_t* ban, int64_t nbanned) {
  GroupMasks g{};
  for (int p = 0; p < GROUP; ++p) {
    const int64_t j = c0 + p * PANEL;
    g.keep[p] = g.valid[p] = j >= vocab ? 0 : lanes(j, vocab);
  }
  for (int64_t e = 0; e < nbanned; ++e) {
    const int64_t d = ban[e] - c0;
    if (d >= 0 && d < GCOLS) {
      g.keep[d / PANEL] &= static_cast<__mmask16>(~(1u << (d % PANEL)));
      g.banned = true;
    }
  }
  return g;
}

enum class Half { FIRST, SECOND, ALONE };  // a group's place in its block

// The group's maximum lanes of a row, into its block's maximum bm (FIRST: kept for SECOND)
inline void block_max(__m512 mx, Half half, float* held, float* bm) {
  if (half == Half::FIRST)
    _mm512_storeu_ps(held, mx);
  else
    *bm = _mm512_reduce_max_ps(half == Half::SECOND ? _mm512_max_ps(mx, _mm512_loadu_ps(held)) : mx);
}

// The group's logits buf[rows, 64] folded into the rows' sums (ref, sum: row 0's), their
// maxima into the block maxima (bm: row 0's entry of the group's block).
inline void group_summary(const float* buf, int64_t rows, const GroupMasks& gm, Half half, float* ref, float* sum,
                          float* held, float* bm, int64_t nb) {
  const __m512 neg = _mm512_set1_ps(NEG_INF), l2e = _mm512_set1_ps(LOG2E);
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v[GROUP], most = neg;
    for (int g = 0; g < GROUP; ++g) {
      v[g] = _mm512_loadu_ps(buf + (r * GROUP + g) * PANEL);
      most = _mm512_mask_max_ps(most, gm.valid[g], most, v[g]);
    }
    __m512 kept = most;
    if (gm.banned) {  // the block maxima leave the banned tokens out; the sum keeps them
      kept = neg;
      for (int g = 0; g < GROUP; ++g) kept = _mm512_mask_max_ps(kept, gm.keep[g], kept, v[g]);
    }
    block_max(kept, half, held + r * 16, bm + r * nb);
    __m512 s = _mm512_loadu_ps(sum + r * 16);
    if (_mm512_cmp_ps_mask(most, _mm512_set1_ps(ref[r] + 64.0f), _CMP_GT_OQ)) {
      // the row's first columns, or a maximum far enough above the reference that
      // e^(x - ref) x V could overflow: the reference moves up to this group's maximum
      const float moved = _mm512_reduce_max_ps(most);
      s = _mm512_mul_ps(s, _mm512_set1_ps(std::exp(ref[r] - moved)));
      ref[r] = moved;
    }
    const __m512 shift = _mm512_set1_ps(ref[r] * LOG2E);
    for (int g = 0; g < GROUP; ++g)  // e^(x - ref) = 2^(x log2(e) - ref log2(e))
      s = _mm512_mask_add_ps(s, gm.valid[g], s, exp2_lean(_mm512_fmsub_ps(v[g], l2e, shift)));
    _mm512_storeu_ps(sum + r * 16, s);
  }
}

// Rows [r0, r0 + rows) at columns [c0, c0 + chunk) (whole blocks) into the thread's sums, and
// their blocks' maxima into bm [B, nb]; group_logits(g0, buf) writes the rows' logits at
// columns [g0, g0 + 64) into buf [rows, 64].
template <class GroupLogits>
inline void chunk_summary(GroupLogits&& group_logits, int64_t r0, int64_t rows, int64_t c0, int64_t chunk,
                          int64_t vocab, const int64_t* ban, int64_t nbanned, FusedSums& fs, float* bm, int64_t nb) {
  for (int64_t blk0 = c0; blk0 < std::min(c0 + chunk, vocab); blk0 += BLK) {
    const bool pair = blk0 + GCOLS < vocab;
    for (int h = 0; h < (pair ? 2 : 1); ++h) {
      const int64_t g0 = blk0 + h * GCOLS;
      const Half half = !pair ? Half::ALONE : h == 0 ? Half::FIRST : Half::SECOND;
      group_logits(g0, fs.buf.data());
      group_summary(fs.buf.data(), rows, group_masks(g0, vocab, ban, nbanned), half, fs.ref.data() + r0,
                    fs.lanes.data() + r0 * 16, fs.halves.data() + r0 * 16, bm + r0 * nb + blk0 / BLK, nb);
    }
  }
}

}  // namespace bounded::summary

#endif
