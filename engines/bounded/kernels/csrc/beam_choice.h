// The choice of beams from a fused head's summary, whatever computes the logits: shared by
// the bf16 head (beam_head.cpp) and the float32 one (beam_head_f32.cpp).
//
// log p(t | b) = logit - lse[b], a per-row shift, so a block's best continuation scores
// cum[b] + (block_max - lse[b]) exactly, and a request's best k continuations lie in its
// best k blocks. Those blocks' logits are computed again by the caller's `row_logits` (the
// same values as the summary's) and their best k are the answer.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "work_shares.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

namespace bounded {

constexpr int64_t BLK = 128;  // tokens per block: the first stage of the choice ranks blocks by their best

struct RowSum {  // one row's log-sum-exp so far, in one share of the columns: m + log(s), m near the maximum
  float m = -std::numeric_limits<float>::infinity(), s = 0.0f;
};

constexpr int64_t SLABS = 32;  // the fused heads' summary: fixed shares of the vocabulary's chunks

// lse[row] from every share of the row's sum, merged in order
inline void merge_sums(const std::vector<std::vector<RowSum>>& sums, int64_t b, float* lse) {
  for (int64_t row = 0; row < b; ++row) {
    float m = -std::numeric_limits<float>::infinity(), s = 0.0f;
    for (const auto& per : sums) m = std::max(m, per[row].m);
    for (const auto& per : sums)
      if (per[row].s > 0.0f) s += per[row].s * std::exp(per[row].m - m);
    lse[row] = m + std::log(s);
  }
}

struct Scored {  // a block (token: its index) or a continuation
  float score;
  int64_t row, token;
};

// best first; ties by row, then token (a fixed order)
inline bool by_score(const Scored& x, const Scored& y) {
  if (x.score != y.score) return x.score > y.score;
  return x.row != y.row ? x.row < y.row : x.token < y.token;
}

inline at::Tensor banned_ids(const at::Tensor& banned) {
  TORCH_CHECK(banned.scalar_type() == at::kLong && banned.dim() == 1, "beam head: banned must be int64 [E]");
  return banned.contiguous();
}

// Each request's best k continuations cum + (logit - lse), best first: scores [R, k] float32
// (-inf: none), parent row within the request [R, k], token [R, k] int64. b = R * W rows;
// lse [b] and block_max [b, nb] from the summary of the same rows; row_logits(row, c0, x)
// writes the BLK logits of `row` from token c0 into x (the summary's values). `setup()` runs
// once in each worker thread before its requests and what it returns lives while they run
// (e.g. an AMX tile configuration).
template <class Setup, class RowLogits>
std::tuple<at::Tensor, at::Tensor, at::Tensor> choose(int64_t vocab, const at::Tensor& banned, const at::Tensor& lse_t,
                                                      const at::Tensor& bmax_t, const at::Tensor& cum, int64_t k, int64_t b,
                                                      const char* summary, Setup&& setup, RowLogits&& row_logits) {
  const at::Tensor ban = banned_ids(banned);
  const int64_t nbanned = ban.numel(), nb = (vocab + BLK - 1) / BLK;
  TORCH_CHECK(cum.dim() == 2 && cum.scalar_type() == at::kFloat && cum.numel() == b,
              "beam head: cum must be float32 [R, W] with R * W = the hidden rows");
  TORCH_CHECK(lse_t.scalar_type() == at::kFloat && lse_t.numel() == b && bmax_t.scalar_type() == at::kFloat &&
                  bmax_t.dim() == 2 && bmax_t.size(0) == b && bmax_t.size(1) == nb,
              "beam head: lse [B] and block_max [B, ", nb, "] float32 must come from ", summary);
  TORCH_CHECK(k >= 1 && k <= vocab - nbanned, "beam head: k must lie in 1..", vocab - nbanned, ", got ", k);
  constexpr float NEG = -std::numeric_limits<float>::infinity();
  const int64_t nreq = cum.size(0), w = cum.size(1);
  const at::Tensor cumc = cum.contiguous(), lse_c = lse_t.contiguous(), bmax_c = bmax_t.contiguous();
  const int64_t* bp = ban.data_ptr<int64_t>();
  const float* lse = lse_c.data_ptr<float>();
  const float* bmax = bmax_c.data_ptr<float>();
  at::Tensor scores = at::full({nreq, k}, NEG, cum.options());
  at::Tensor parents = at::zeros({nreq, k}, cum.options().dtype(at::kLong));
  at::Tensor tokens = at::zeros({nreq, k}, cum.options().dtype(at::kLong));
  const float* cp = cumc.data_ptr<float>();
  float* sp = scores.data_ptr<float>();
  int64_t* pp = parents.data_ptr<int64_t>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  at::parallel_for(0, nreq, 1, [&](int64_t q0, int64_t q1) {
    [[maybe_unused]] const auto held = setup();
    std::vector<Scored> order, blocks, cand;
    alignas(64) float x[BLK];
    for (int64_t q = q0; q < q1; ++q) {
      // 1. the request's best k blocks by cum + (block max - lse): they hold its best k
      //    continuations (the expression is monotone in the logit). Rows in order of their
      //    best block offer their blocks to a heap of the k best so far (its top the worst),
      //    until a row's best cannot enter it: where beams' scores differ by a few nats,
      //    most rows are never read past their maximum.
      order.clear();
      for (int64_t i = 0; i < w; ++i) {
        const int64_t row = q * w + i;
        const float most = at::vec::reduce_all<float>(
            [](const at::vec::Vectorized<float>& x, const at::vec::Vectorized<float>& y) {
              return at::vec::maximum(x, y);
            },
            bmax + row * nb, nb);
        order.push_back({cp[row] + (most - lse[row]), i, 0});
      }
      std::sort(order.begin(), order.end(), by_score);
      blocks.clear();
      for (const Scored& o : order) {
        if (static_cast<int64_t>(blocks.size()) == k && o.score < blocks.front().score) break;
        const int64_t row = q * w + o.row;
        const float c = cp[row], l = lse[row];
        const float* bm = bmax + row * nb;
        for (int64_t j = 0; j < nb; ++j) {
          const Scored blk{c + (bm[j] - l), o.row, j};
          if (static_cast<int64_t>(blocks.size()) < k) {
            blocks.push_back(blk);
            std::push_heap(blocks.begin(), blocks.end(), by_score);
          } else if (by_score(blk, blocks.front())) {
            std::pop_heap(blocks.begin(), blocks.end(), by_score);
            blocks.back() = blk;
            std::push_heap(blocks.begin(), blocks.end(), by_score);
          }
        }
      }
      const int64_t nbest = static_cast<int64_t>(blocks.size());
      // 2. those blocks' logits again, value for value, and the best k: where k blocks were
      //    chosen, each one's best scores at least the k-th block's score, so the k best
      //    continuations do too and nothing below it is a candidate
      const float least = nbest == k ? blocks.front().score : NEG;
      cand.clear();
      for (int64_t t = 0; t < nbest; ++t) {
        const int64_t i = blocks[t].row, row = q * w + i, c0 = blocks[t].token * BLK;
        const int64_t n = std::min(BLK, vocab - c0);
        row_logits(row, c0, x);
        for (int64_t e = 0; e < nbanned; ++e)
          if (bp[e] >= c0 && bp[e] < c0 + n) x[bp[e] - c0] = NEG;
        const float c = cp[row], l = lse[row];
        for (int64_t j = 0; j < n; ++j) {
          const float score = c + (x[j] - l);
          if (score >= least) cand.push_back({score, i, c0 + j});
        }
      }
      const int64_t n = std::min<int64_t>(k, static_cast<int64_t>(cand.size()));
      std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), by_score);
      for (int64_t j = 0; j < n; ++j) {
        sp[q * k + j] = cand[j].score;
        pp[q * k + j] = cand[j].row;
        tp[q * k + j] = cand[j].token;
      }
    }
  });
  return {scores, parents, tokens};
}

}  // namespace bounded
