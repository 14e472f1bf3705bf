"""What a device computes natively: the ISA facts that decide precision (CPU flags, CUDA
compute capability), read by `probe` and passed around as a frozen `Capabilities`, so tests
inject the CPU they need (one with native bf16, one without) instead of the one they run on.

Pitfall (DESIGN.md 7): on a CPU without AVX512-BF16, `torch.ops.mkldnn._is_mkldnn_bf16_supported()`
answers True and `torch.backends.cpu.get_cpu_capability()` says only "AVX512": neither
tells native from emulated bf16, so the CPU's flags are read instead.
"""
from __future__ import annotations

import functools
import platform
import threading
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, TypeVar

T = TypeVar("T")

# the CPU flags (as /proc/cpuinfo spells them) that decide which precisions run natively
PRECISION_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
                   "amx_tile", "amx_bf16", "amx_fp16", "amx_int8")
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Capabilities:
    device_type: str  # "cpu" | "cuda"
    name: str
    flags: frozenset[str] = frozenset()  # CPU: the PRECISION_FLAGS present
    compute_capability: tuple[int, int] | None = None  # CUDA

    def native(self, dtype: str) -> bool:
        """Does the device run dense GEMMs in `dtype` in hardware (not converted to float32)?"""
        if dtype == "float32":
            return True
        if self.device_type == "cuda":
            cc = self.compute_capability or (0, 0)
            return {"bfloat16": cc >= (8, 0), "float16": cc >= (7, 0)}.get(dtype, False)
        need = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}.get(dtype, ())
        return any(f in self.flags for f in need)

    @property
    def int8_isa(self) -> str | None:
        """The int8 dot-product instructions int8 GEMMs run on, best first; None: none."""
        if self.device_type == "cuda":
            cc = self.compute_capability or (0, 0)
            return "int8 tensor cores" if cc >= (7, 5) else None
        for flag in ("amx_int8", "avx512_vnni", "avx_vnni"):
            if flag in self.flags:
                return flag
        return None

    @property
    def fp8(self) -> bool:
        return self.device_type == "cuda" and (self.compute_capability or (0, 0)) >= (8, 9)

    def facts(self) -> dict[str, object]:
        """For run.json and `bench doctor`."""
        out: dict[str, object] = {"device": self.device_type, "name": self.name,
                                  "native": {d: self.native(d) for d in FLOAT_DTYPES},
                                  "int8": self.int8_isa, "fp8": self.fp8}
        if self.device_type == "cuda":
            out["compute_capability"] = ".".join(map(str, self.compute_capability or ()))
        else:
            out["flags"] = sorted(self.flags)
        return out

    def key(self) -> str:
        """What a cached measurement of this device depends on besides its name."""
        if self.device_type == "cuda":
            return f"sm{''.join(map(str, self.compute_capability or ()))}"
        return ",".join(sorted(self.flags)) or "no precision flags"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


@functools.lru_cache(maxsize=1)
def all_cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_flags() -> frozenset[str]:
    return all_cpu_flags() & frozenset(PRECISION_FLAGS)


def onednn_int8_exact() -> bool:
    """Whether oneDNN's u8 x s8 int8 linear gives exact integer sums on this CPU: with VNNI
    or AMX it does; without them (an AVX2-only CPU such as AMD Zen 3) it pairs products into
    saturating 16-bit sums (vpmaddubsw), and activations near the zero point 128 overflow
    them (measured on Zen 3: errors of 13 on outputs of magnitude 44)."""
    return Capabilities("cpu", "", cpu_flags()).int8_isa is not None


def onednn_packs_bf16() -> bool:
    """Whether oneDNN's bf16 weight prepack (`mkldnn._reorder_linear_weight`) runs on this
    CPU: it needs AVX512BW/VL/DQ or AVX-NE-CONVERT, and raises elsewhere (an AVX2-only CPU
    such as AMD Zen 3), where bf16 GEMMs stay aten's matmul."""
    flags = all_cpu_flags()
    return {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags


def on_own_thread(fn: Callable[[], T]) -> T:
    """fn() on a thread of its own, joined: for CPU work (a rate probe) outside the model
    thread. GNU OpenMP (torch's) gives each thread that opens a parallel region a team of its
    own, kept while that thread lives; once the process's teams outnumber the CPUs, every
    team's idle workers sleep at once instead of spinning, and each parallel region wakes them
    through the kernel. A probe run on the caller's (main) thread made every later small GEMM
    on the engine's model thread ~2x slower: [384, 64] x [64, 256] on 2 threads, 41 -> 94 us
    (an Emerald Rapids, torch 2.13). A thread that ends takes its team with it."""
    out: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            error.append(e)

    t = threading.Thread(target=run, name="cpu-probe")
    t.start()
    t.join()
    if error:
        raise error[0]
    return out[0]


# The shape `cpu_gemm_gflops` times: a layer's MLP GEMM of a 0.5-1B model over a few hundred rows.
RATE_SHAPE = (512, 1024, 2048)


@functools.lru_cache(maxsize=None)
def cpu_gemm_gflops(dtypes: tuple[str, ...]) -> Mapping[str, float]:
    """{dtype: GFLOP/s of torch's matmul in it on this CPU at RATE_SHAPE}, measured once per
    process: the dtypes take turns (one call each, repeated: a busy spell on a shared machine
    slows them alike), best of at least 8 rounds over >= 60 ms, after two warm-up rounds.

    A CPU flag says that an instruction exists, not that it is fast: a Sapphire/Emerald Rapids
    whose hypervisor hides AMX runs bf16 GEMMs on AVX512-BF16 at ~0.6x its float32 rate, a
    Zen 4 at ~2.4x (both measured with torch 2.13 on 2 cores). Timed on a thread of its own
    (`on_own_thread`)."""
    return on_own_thread(lambda: _gemm_gflops(dtypes))


def _gemm_gflops(dtypes: tuple[str, ...]) -> Mapping[str, float]:
    import time

    import torch

    m, k, n = RATE_SHAPE
    pairs = {d: (torch.randn(m, k).to(getattr(torch, d)), torch.randn(k, n).to(getattr(torch, d))) for d in dtypes}
    best = dict.fromkeys(dtypes, float("inf"))
    rounds, end = 0, time.perf_counter() + 0.06
    while rounds < 10 or time.perf_counter() < end:
        for d, (a, b) in pairs.items():
            t = time.perf_counter()
            torch.matmul(a, b)
            if rounds >= 2:
                best[d] = min(best[d], time.perf_counter() - t)
        rounds += 1
    return MappingProxyType({d: 2 * m * k * n / s / 1e9 for d, s in best.items()})


def probe(device: str = "cpu") -> Capabilities:
    """The capabilities of `device` ("cpu", "cuda", "cuda:N") on this machine."""
    if device.startswith("cuda"):
        import torch

        dev = torch.device(device)
        return Capabilities("cuda", torch.cuda.get_device_name(dev),
                            compute_capability=tuple(torch.cuda.get_device_capability(dev)))
    return Capabilities("cpu", cpu_name(), cpu_flags())
