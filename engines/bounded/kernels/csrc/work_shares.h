// Splitting a kernel's work between torch's threads in fixed shares, each thread taking the
// next share from a shared counter as it finishes one. at::parallel_for's static split (one
// range a thread) left a thread waiting on the other's range whenever the machine slowed one
// of them: the fused beam heads' summary ran 16-48 % faster this way at K = 896 (tens of ms a
// call) and 21-32 % at K = 64 on a busy Xeon with AMX (2026-12-07); the prefill attention's units (varlen_units.h) were
// shared this way before; the norms and SwiGLU (under a millisecond a call) showed no
// difference and keep the static split. Which thread takes a share changes nothing in what it
// computes.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace bounded {

// body(share, begin, end, state) for each of `shares` fixed ranges [begin, end) of n items:
// as many workers as torch's pool has threads (at most one a share), each with its own state
// (make()).
template <class Make, class Body>
void each_share(int64_t n, int64_t shares, Make&& make, Body&& body) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), shares));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    auto state = make();
    for (int64_t s = next++; s < shares; s = next++) body(s, s * n / shares, (s + 1) * n / shares, state);
  });
}

}  // namespace bounded
