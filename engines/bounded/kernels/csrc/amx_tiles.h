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
};

// c[16 RT rows, 16 CT columns] (float32, ldc floats apart; not rounded) = a[16 RT rows of bf16,
// lda_bytes apart] x B, over kt steps of 32 along the contraction: step t's B tile of column
// block j (16 pairs x 16 columns, ldb_bytes a pair row) at b + j * col_bytes + t * step_bytes.
// Tiles 0-3 the sums, 4-5 a's rows, 6-7 B; a's and c's rows past the caller's are scratch.
template <int RT, int CT>
AMX_TARGET inline void tile_product(const void* a, int64_t lda_bytes, const void* b, int64_t col_bytes,
                                    int64_t step_bytes, int64_t ldb_bytes, int64_t kt, float* c, int64_t ldc) {
  static_assert((RT == 1 || RT == 2) && (CT == 1 || CT == 2), "1 or 2 tiles of rows and of columns");
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  _tile_zero(0);
  if (CT == 2) _tile_zero(1);
  if (RT == 2) {
    _tile_zero(2);
    if (CT == 2) _tile_zero(3);
  }
  for (int64_t t = 0; t < kt; ++t) {
    _tile_loadd(6, pb + t * step_bytes, ldb_bytes);
    if (CT == 2) _tile_loadd(7, pb + col_bytes + t * step_bytes, ldb_bytes);
    _tile_loadd(4, pa + t * 64, lda_bytes);
    _tile_dpbf16ps(0, 4, 6);
    if (CT == 2) _tile_dpbf16ps(1, 4, 7);
    if (RT == 2) {
      _tile_loadd(5, pa + 16 * lda_bytes + t * 64, lda_bytes);
      _tile_dpbf16ps(2, 5, 6);
      if (CT == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  const int64_t ldc_bytes = ldc * static_cast<int64_t>(sizeof(float));
  _tile_stored(0, c, ldc_bytes);
  if (CT == 2) _tile_stored(1, c + 16, ldc_bytes);
  if (RT == 2) {
    _tile_stored(2, c + 16 * ldc, ldc_bytes);
    if (CT == 2) _tile_stored(3, c + 16 * ldc + 16, ldc_bytes);
  }
}

}  // namespace bounded
