// AMX tiles for the bf16 kernels (beam_head.cpp, varlen_attention.cpp): whether this process
// may use them, and a thread's tile configuration while it computes with them.
#pragma once

#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace bounded {

// AMX-BF16 and AMX-TILE (CPUID leaf 7, EDX bits 22 and 24) and Linux's leave for this process
// to use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); an environment
// variable `off` set to 0 keeps a kernel's AVX512-BF16 form (to compare the two).
inline bool cpu_allows_amx() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1u) || !((d >> 24) & 1u)) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}

inline bool amx_permitted(const char* off) {
  const char* env = std::getenv(off);
  return !(env != nullptr && std::strcmp(env, "0") == 0) && cpu_allows_amx();
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// 8 tiles of 64-byte rows: 0-5 of m rows (sums and A operands), 6-7 of 16 (B operands: 16 pairs)
AMX_TARGET inline void configure_tiles(int m) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = static_cast<uint8_t>(t < 6 ? m : 16);
  }
  // the whole 64 bytes as the operand (the intrinsic names only its first 8, and the compiler
  // may then drop the stores of the rest)
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}

AMX_TARGET inline void release_tiles() { _tile_release(); }

// While a thread computes with tiles: configured on entry, released on exit.
struct Tiles {
  bool on;
  Tiles(bool amx, int m) : on(amx) {
    if (on) configure_tiles(m);
  }
  ~Tiles() {
    if (on) release_tiles();
  }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
  Tiles(Tiles&& o) noexcept : on(o.on) { o.on = false; }
};

}  // namespace bounded
