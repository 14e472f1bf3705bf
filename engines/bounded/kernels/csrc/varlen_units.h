// The work plan both native prefill attentions share (varlen_attention.cpp for bf16,
// varlen_attention_f32.cpp for float32): a packed batch's sequences, each with its optional
// prefix (a query whose K/V its items share), cut into units of (sequence, K/V head), and
// the loop that shares the units out to the threads of torch's pool, largest first.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "work_shares.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace bounded {

struct Unit {             // one sequence and one K/V head
  int64_t own0, own1;     // the sequence's packed rows
  int64_t pre0, pre_len;  // prefix rows (pre_len 0: none)
  int64_t head;           // K/V head
  int64_t work;           // its attention work (query-key pairs), the order units are taken in
};

// The units of a batch of t packed rows: cu_seqlens [S+1] offsets ending at t; prefix [S]
// (or none) -1 or an earlier sequence without a prefix. Largest first.
inline std::vector<Unit> varlen_units(const at::Tensor& cu_seqlens, const c10::optional<at::Tensor>& prefix,
                                      int64_t t, int64_t hkv) {
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
  units.reserve(s * hkv);
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
  std::stable_sort(units.begin(), units.end(), [](const Unit& x, const Unit& y) { return x.work > y.work; });
  return units;
}

// run(unit, scratch) for every unit: as many workers as torch's pool has threads (at most one
// per unit), each with its own Scratch, taking the next unit from a shared counter.
template <class Scratch, class Run>
void run_units(const std::vector<Unit>& units, Run&& run) {
  const int64_t n = static_cast<int64_t>(units.size());
  each_share(n, n, [] { return Scratch(); }, [&](int64_t i, int64_t, int64_t, Scratch& w) { run(units[i], w); });
}

}  // namespace bounded
