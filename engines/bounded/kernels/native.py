"""The engine's native CPU kernels (csrc/), built once per machine and source with torch's
C++ extension builder, loaded into the process on first use.

The "native" prefill attention for bf16 on CPUs with AVX512-BF16, called from the compiled
graphs directly: `varlen_attention_bf16` (q, k, v as the model made them; also the body of
the Python bounded::varlen_attention there: attention.py) and `varlen_attention_rope_bf16`
(the qkv projection as the GEMM gave it; the q/k norm and RoPE done inside). And the beam
step's fused head (csrc/beam_head.cpp, called eagerly by runtime/beam_head.py): the head GEMM
with its log-sum-exp and block maxima as its epilogue, then the exact top-k continuations,
no [rows, V] logits written (`beam_head_top`). And the bf16 MLP's SwiGLU (`swiglu_bf16`,
csrc/swiglu.cpp: the graphs call it through kernels/dense.swiglu), and the int8 MLP's middle
(`swiglu_quant_bf16`: gate_up's product scaled, SwiGLU, quantised for down, in one pass;
model/layers.GatedMLP). And the residual add with the RMSNorm after it, in one pass, its
output bf16 or quantised for an int8 GEMM, and that quantisation alone (csrc/norms.cpp,
called through kernels/norms.py). Built into
`$BOUNDED_BENCH_CACHE/native/<digest>/` (~30 s with g++), named by a digest of the sources
and torch's version, so an edit or a new torch builds anew and a stale library never loads.
Where it cannot be had -- no C++ compiler, a CPU without AVX512-BF16, a failed build --
`available()` says False with the reason in `status()`, and the Python kernels serve.

A second library, `F32`, serves the float32 plans (policy auto's choice on a CPU without
native bf16, e.g. Zen 3 or Ice Lake; the hold-out plans everywhere): `varlen_attention_f32`
(csrc/varlen_attention_f32.cpp, and its fused q/k norm + RoPE entry), the "native"
attention of float32 plans and the body of bounded::varlen_attention for float32; the beam
decode step's attention (`beam_attention_f32`, csrc/beam_attention_f32.cpp: float32 K/V in
every plan, so bf16 plans call it too); the fused float32 beam head
(csrc/beam_head_f32.cpp); and the float32 MLP's SwiGLU (`swiglu_f32`, csrc/swiglu_f32.cpp).
Built for AVX2 + FMA; on a CPU with AVX-512 (F and DQ) its GEMM micro-kernels, softmax
exponentials and SwiGLU take 512-bit registers. `BOUNDED_NATIVE=0` turns both off.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from engines.hardware import all_cpu_flags, cpu_flags
from engines.server.venv import cache_dir

# AVX-512 for the whole file, so ATen's Vectorized<float> (exp, max, bf16 conversion) is its
# 512-bit implementation, not the portable one that loops over scalars: the library is only
# built and loaded on a CPU with AVX512-BF16 (`cpu_has_bf16_dot`).
# -fopenmp: ATen's parallel_for is OpenMP inlined from its headers (without it the units run
# on the calling thread alone); the libgomp it links is torch's own, already loaded.
CFLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma",
          "-DCPU_CAPABILITY_AVX512", "-DCPU_CAPABILITY=AVX512"]
# The float32 attention (csrc/varlen_attention_f32.cpp): AVX2 + FMA, so any x86-64 CPU of the
# last decade runs it (Zen 3 and Ice Lake among them, where policy auto computes in float32).
# On a CPU with AVX-512 the GEMM micro-kernels of the attention and the beam head, and the
# SwiGLU, take 512-bit registers (f32_kernels.h, swiglu_f32.cpp); the rest stays AVX2 code
# (ATen's Vectorized is chosen by CPU_CAPABILITY).
CFLAGS_F32 = ["-O3", "-fopenmp", "-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2",
              *(["-mavx512f", "-mavx512dq"] if {"avx512f", "avx512dq"} <= all_cpu_flags() else [])]


def cpu_has_bf16_dot() -> bool:
    """AVX512-BF16 (Zen 4+, Cooper Lake, Sapphire Rapids+): the instruction the kernel uses."""
    return "avx512_bf16" in cpu_flags()


def cpu_has_avx2_fma() -> bool:
    return {"avx2", "fma"} <= all_cpu_flags()


class Library:
    """One native library: its sources, flags, the CPU it needs, the fake (shape) functions
    of its ops for torch.export. Built once per machine and source, loaded on first use."""

    def __init__(self, name: str, sources: tuple[str, ...], cflags: list[str], cpu_ok: Callable[[], bool],
                 cpu_needs: str, fakes: Callable[[], None]):
        csrc = Path(__file__).parent / "csrc"
        self.name, self.sources = name, tuple(csrc / s for s in sources)
        self.headers = tuple(sorted(csrc.glob("*.h")))  # every header in the digest (any source may include it)
        self.cflags, self.cpu_ok, self.cpu_needs, self.fakes = cflags, cpu_ok, cpu_needs, fakes
        self._lock = threading.Lock()
        self._state: dict[str, Optional[str]] = {}  # "error": why it is unavailable (None: loaded)

    def build_dir(self) -> Path:
        digest = hashlib.sha256(b"".join(s.read_bytes() for s in self.sources + self.headers) + " ".join(self.cflags).encode()
                                + torch.__version__.encode()).hexdigest()[:16]
        return cache_dir() / "native" / digest

    def load(self, log: Callable[[str], None] = print) -> bool:
        """Build (first time on this machine) and load the library. -> whether it is usable.
        Thread-safe; later calls only answer."""
        with self._lock:
            if "error" not in self._state:
                self._state["error"] = self._load(log)
                if self._state["error"]:
                    log(f"native CPU kernels ({self.name}) unavailable ({self._state['error']}); the Python kernels serve")
            return self._state["error"] is None

    def available(self) -> bool:
        """Loaded and usable (never builds: call `load` first)."""
        return self._state.get("error", "not loaded") is None

    def status(self) -> str:
        return "loaded" if self.available() else self._state.get("error") or "not loaded"

    def _load(self, log: Callable[[str], None]) -> Optional[str]:
        if os.environ.get("BOUNDED_NATIVE", "1") == "0":
            return "disabled by BOUNDED_NATIVE=0"
        if not self.cpu_ok():
            return f"this CPU has no {self.cpu_needs}"
        from torch.utils import cpp_extension

        here = str(Path(sys.executable).parent)  # pip's ninja, where the environment is not activated
        if shutil.which("ninja") is None and shutil.which("ninja", path=here):
            os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
        out = self.build_dir()
        out.mkdir(parents=True, exist_ok=True)
        if not any(out.glob("*.so")):
            log(f"building the native CPU kernels ({self.name}; once per machine and source) in {out} ...")
        try:
            cpp_extension.load(f"bounded_native_{out.name}", [str(s) for s in self.sources], extra_cflags=self.cflags,
                               extra_ldflags=["-fopenmp"], build_directory=str(out), is_python_module=False,
                               verbose=False)
        except Exception as e:  # no compiler, headers, ...: say why in one line (the compiler's first error)
            lines = str(e).strip().splitlines() or [""]
            first = next((line for line in lines if "error" in line.lower()), lines[-1])
            return f"build failed: {type(e).__name__}: {first.strip()[:300]}"
        self.fakes()
        return None


def _bf16_fakes() -> None:
    # the ops' output shapes for torch.export (the graphs of the "native" attention call them)
    torch.library.register_fake("bounded_native::varlen_attention_bf16")(_fake_varlen_attention)
    torch.library.register_fake("bounded_native::varlen_attention_rope_bf16")(_fake_varlen_attention_rope)
    torch.library.register_fake("bounded_native::swiglu_bf16")(_fake_swiglu)
    torch.library.register_fake("bounded_native::swiglu_quant_bf16")(_fake_swiglu_quant)
    torch.library.register_fake("bounded_native::add_rms_norm_bf16")(_fake_add_rms_norm)
    torch.library.register_fake("bounded_native::add_rms_norm_quant_bf16")(_fake_add_rms_norm_quant)
    torch.library.register_fake("bounded_native::quantise_rows_bf16")(_fake_quantise_rows)


def _f32_fakes() -> None:
    torch.library.register_fake("bounded_native_f32::varlen_attention_f32")(_fake_varlen_attention)
    torch.library.register_fake("bounded_native_f32::varlen_attention_rope_f32")(_fake_varlen_attention_rope)
    torch.library.register_fake("bounded_native_f32::beam_attention_f32")(_fake_beam_attention)
    torch.library.register_fake("bounded_native_f32::swiglu_f32")(_fake_swiglu)


BF16 = Library("bf16", ("varlen_attention.cpp", "beam_head.cpp", "swiglu.cpp", "norms.cpp"), CFLAGS, cpu_has_bf16_dot,
               "AVX512-BF16", _bf16_fakes)
F32 = Library("float32", ("varlen_attention_f32.cpp", "beam_attention_f32.cpp", "beam_head_f32.cpp", "swiglu_f32.cpp"),
              CFLAGS_F32, cpu_has_avx2_fma, "AVX2 and FMA", _f32_fakes)
SOURCES = BF16.sources

# the bf16 library, as most callers name it
load, available, status, build_dir = BF16.load, BF16.available, BF16.status, BF16.build_dir


def _fake_swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)


def _fake_swiglu_quant(product: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, inner = product.shape[0], product.shape[1] // 2
    return product.new_empty(rows, inner, dtype=torch.uint8), product.new_empty(rows, 1, dtype=torch.float32)


def _fake_add_rms_norm(x: torch.Tensor, delta: torch.Tensor, delta_scale: Optional[torch.Tensor],
                       weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=torch.bfloat16)


def _fake_add_rms_norm_quant(x: torch.Tensor, delta: torch.Tensor, delta_scale: Optional[torch.Tensor],
                             weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=torch.uint8), x.new_empty(x.shape[0], 1)


def _fake_quantise_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape, dtype=torch.uint8), x.new_empty(x.shape[0], 1, dtype=torch.float32)


def _fake_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                           prefix: Optional[torch.Tensor] = None) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def _fake_beam_attention(q: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def _fake_varlen_attention_rope(qkv: torch.Tensor, hq: int, hkv: int, q_norm: Optional[torch.Tensor],
                                k_norm: Optional[torch.Tensor], eps: float, cos: torch.Tensor, sin: torch.Tensor,
                                positions: torch.Tensor, cu_seqlens: torch.Tensor,
                                prefix: Optional[torch.Tensor] = None,
                                row_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    return qkv.new_empty(qkv.shape[0], qkv.shape[1] // (hq + 2 * hkv) * hq)


def beam_head_top(hidden: Tensor, packed: Tensor, vocab: int, banned: Tensor, cum: Tensor,
                  k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The fused beam head: hidden [R * W, K] bf16 or float32 (contiguous), packed
    (pack_head_bf16 / pack_head_f32 of the [V, K] head), banned [E] int64 ids, cum [R, W]
    float32 -> each request's best k continuations cum + log_softmax(logits) (banned ids -inf
    after it), best first: scores [R, k] (-inf: none), parent rows [R, k], tokens [R, k]. Two
    ops, so that a profile sees the GEMM (with its epilogue) apart from the choice."""
    if hidden.dtype == torch.float32:
        ops, summary, choose = torch.ops.bounded_native_f32, "head_gemm_summary_f32", "head_choose_f32"
    else:
        ops, summary, choose = torch.ops.bounded_native, "head_gemm_summary_bf16", "head_choose_bf16"
    lse, block_max = getattr(ops, summary)(hidden, packed, vocab, banned)
    return getattr(ops, choose)(hidden, packed, vocab, banned, lse, block_max, cum, k)


class NativeAttention:
    """Attention "native" over one packed batch: called on q/k/v as the model made them, or
    `fused` on the qkv projection as its GEMM gave it, the q/k norms and RoPE done inside the
    kernel as it reads q and k (no separate norm + RoPE kernel writing them and reading them
    back; head dims that are multiples of 32, rotary tables in bf16)."""

    def __init__(self, cu_seqlens: Tensor, prefix: Optional[Tensor]):
        self.cu_seqlens, self.prefix = cu_seqlens, prefix

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if q.dtype == torch.float32:
            return torch.ops.bounded_native_f32.varlen_attention_f32(q, k, v, self.cu_seqlens, self.prefix)
        return torch.ops.bounded_native.varlen_attention_bf16(q, k, v, self.cu_seqlens, self.prefix)

    @staticmethod
    def fuses(head_dim: int, dtype: torch.dtype) -> bool:
        if dtype == torch.float32:
            return head_dim % 16 == 0 and head_dim <= 512
        return head_dim % 32 == 0 and head_dim <= 512 and dtype == torch.bfloat16

    def fused(self, qkv: Tensor, heads: int, kv_heads: int, q_norm: Optional[Tensor], k_norm: Optional[Tensor],
              eps: float, cos: Tensor, sin: Tensor, positions: Tensor, row_scale: Optional[Tensor] = None) -> Tensor:
        """qkv [T, (Hq + 2 Hkv) D]; q_norm/k_norm [D] or None; cos/sin [P, D] tables;
        positions [T] -> [T, Hq*D]. `row_scale` [T, 1] float32 (bf16 only: `scales_rows`): qkv
        is an int8 product whose rows the kernel scales as it reads them."""
        if qkv.dtype == torch.float32:
            if row_scale is not None:
                raise ValueError("row_scale: the bf16 kernel's only")
            return torch.ops.bounded_native_f32.varlen_attention_rope_f32(
                qkv, heads, kv_heads, q_norm, k_norm, eps, cos, sin, positions, self.cu_seqlens, self.prefix)
        return torch.ops.bounded_native.varlen_attention_rope_bf16(
            qkv, heads, kv_heads, q_norm, k_norm, eps, cos, sin, positions, self.cu_seqlens, self.prefix, row_scale)

    @staticmethod
    def scales_rows(dtype: torch.dtype) -> bool:
        """Whether `fused` takes an int8 product and its row scales (`row_scale`)."""
        return dtype == torch.bfloat16
