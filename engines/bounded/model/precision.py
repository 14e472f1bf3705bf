"""The precision policy of the bounded engine: the dtype it computes in, the dtype of the
residual stream, and the GEMM kind of each layer group -- the one place where a lower
precision plugs in. `layers.Linear` asks it for its group's kind at load; a GEMM kind is a
registration in GEMM_KINDS (how the weight is held, how the GEMM runs, where it can run),
so adding one (int8 on CPUs, fp8 on GPUs) touches no model code.

`choose_dtype` is the `auto` policy: the scenario's dtype where the device runs it
natively and not much slower than float32, else float32 (a CPU without AVX512-BF16 emulates
bf16 GEMMs at a fifth of its fp32 rate; one whose hypervisor hides AMX runs them on
AVX512-BF16 at ~0.6x, measured at start).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import torch
from torch import Tensor

from engines.bounded.kernels import dense, int8
from engines.hardware import Capabilities

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
PRECISION_MODES = ("auto", *DTYPES)  # option `precision`: auto, or the dtype to compute in

# The GEMM groups of a decoder layer, and the beam step's full-vocabulary head. A policy may
# choose a different GEMM kind per group (e.g. int8 for the MLP only).
LAYER_GROUPS = ("qkv", "o", "gate_up", "down")
HEAD_GROUP = "head"
GEMM_GROUPS = (*LAYER_GROUPS, HEAD_GROUP)


@dataclass(frozen=True)
class GemmKind:
    """How one kind of GEMM is held and run: `prepare(weight [N, K])` -> the buffers a layer
    keeps (made once, at load); `linear(x [T, K], bias, **buffers)` -> y [T, N] in x's dtype;
    `unsupported(device_type, caps)` -> None where it runs, else why not."""

    name: str
    prepare: Callable[[Tensor], dict[str, Tensor]]
    linear: Callable[..., Tensor]
    unsupported: Callable[[str, Capabilities], Optional[str]]
    low_precision: bool = True  # judged by the accuracy gate against float32


def _dense_prepare(w: Tensor) -> dict[str, Tensor]:
    return {"weight": w.contiguous()}


def _fp8_prepare(w: Tensor) -> dict[str, Tensor]:
    w8, scale = dense.fp8_quantise(w)
    return {"weight": w8, "weight_scale": scale}


def _int8_prepare(w: Tensor) -> dict[str, Tensor]:
    q, scale = int8.int8_quantise(w)
    return {"weight": q, "weight_scale": scale, "weight_zero": torch.zeros(q.shape[0], dtype=torch.int64)}


def _fp8_unsupported(device: str, caps: Capabilities) -> Optional[str]:
    return None if caps.fp8 else "fp8 GEMMs need a CUDA GPU with compute capability >= 8.9"


def _int8_unsupported(device: str, caps: Capabilities) -> Optional[str]:
    if device != "cpu":
        return "int8 GEMMs are the CPU path (oneDNN); on a GPU use fp8"
    if caps.int8_isa is None:  # oneDNN's kernel without VNNI/AMX saturates its 16-bit pair sums
        return ("int8 GEMMs need VNNI or AMX (avx512_vnni, avx_vnni or amx_int8): without them oneDNN's "
                "int8 kernel sums in saturating 16 bits and gives wrong results")
    return None


GEMM_KINDS: dict[str, GemmKind] = {}


def register_gemm_kind(kind: GemmKind) -> None:
    GEMM_KINDS[kind.name] = kind


register_gemm_kind(GemmKind("dense", _dense_prepare, lambda x, bias, weight: dense.dense_linear(x, weight, bias),
                            lambda device, caps: None, low_precision=False))
register_gemm_kind(GemmKind("fp8", _fp8_prepare, lambda x, bias, weight, weight_scale:
                            dense.fp8_linear(x, weight, weight_scale, bias), _fp8_unsupported))
register_gemm_kind(GemmKind("int8", _int8_prepare, lambda x, bias, weight, weight_scale, weight_zero:
                            int8.int8_linear(x, weight, weight_scale, weight_zero, bias), _int8_unsupported))


# `auto` keeps a half-precision dtype whose CPU GEMMs run at least this share of float32's rate
# (it halves the bytes every weight read moves; beam steps are bound by them).
HALF_VS_FLOAT32 = 0.8


def choose_dtype(requested: str, mode: str, caps: Capabilities,
                 gflops: Optional[Callable[[tuple[str, ...]], Mapping[str, float]]] = None) -> tuple[str, str]:
    """-> (the dtype to compute in, why): the `precision` option's choice for a scenario dtype.

    `gflops(dtypes)` measures the device's GEMM rate in each (a CPU: `hardware.cpu_gemm_gflops`);
    `auto` asks it only on a CPU whose flags leave the speed open: the dtype's AVX-512
    instructions without the matrix units (AMX) that make it fast for certain."""
    if mode != "auto":
        return mode, f"{mode}: chosen by the precision option"
    if not caps.native(requested):
        return "float32", (f"float32: {caps.name} has no native {requested} (its {requested} GEMMs are "
                           "emulated, slower than float32); precision: auto")
    amx = {"bfloat16": "amx_bf16", "float16": "amx_fp16"}.get(requested)
    if caps.device_type == "cpu" and amx and amx not in caps.flags and gflops is not None:
        rates = gflops((requested, "float32"))
        half, full = rates[requested], rates["float32"]
        if half < HALF_VS_FLOAT32 * full:
            return "float32", (f"float32: {caps.name} runs {requested} GEMMs natively but slower than "
                               f"float32 ({half:,.0f} vs {full:,.0f} GFLOP/s measured, no AMX); precision: auto")
        return requested, (f"{requested}: the scenario's dtype, native on {caps.name} ({half:,.0f} GFLOP/s "
                           f"measured vs float32's {full:,.0f})")
    return requested, f"{requested}: the scenario's dtype, native on {caps.name}"


@dataclass(frozen=True)
class PrecisionPolicy:
    """The dtype of weights/activations, of the residual stream, and the GEMM kind per group.

    `gemm` maps a group of GEMM_GROUPS to a kind of GEMM_KINDS ("dense": a plain matmul in
    `dtype`; "int8": W8A8, CPU; "fp8": float8_e4m3fn, CUDA cc >= 8.9); absent groups are dense.
    `requested` is the scenario's dtype and `why` says how `dtype` was chosen from it.
    """

    dtype: str = "bfloat16"
    residual: str = "float32"  # dtype of the residual stream between layers
    gemm: dict[str, str] = field(default_factory=lambda: {g: "dense" for g in LAYER_GROUPS})
    requested: str = ""
    why: str = ""

    def __post_init__(self) -> None:
        for name in (self.dtype, self.residual):
            if name not in DTYPES:
                raise ValueError(f"dtype {name!r} is not supported; choose one of {', '.join(DTYPES)}")
        for group, kind in self.gemm.items():
            if group not in GEMM_GROUPS or kind not in GEMM_KINDS:
                raise ValueError(f"precision gemm {group}={kind!r}: groups are {', '.join(GEMM_GROUPS)}, "
                                 f"kinds are {', '.join(GEMM_KINDS)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def residual_torch_dtype(self) -> torch.dtype:
        return DTYPES[self.residual]

    def gemm_kind(self, group: str) -> str:
        return self.gemm.get(group, "dense")

    def low_precision_groups(self, groups: tuple[str, ...] = GEMM_GROUPS) -> dict[str, str]:
        """{group: kind} of the `groups` the accuracy gate must judge."""
        return {g: k for g, k in sorted(self.gemm.items()) if GEMM_KINDS[k].low_precision and g in groups}

    def with_dtype(self, dtype: str) -> "PrecisionPolicy":
        """The same residual, every GEMM dense, in `dtype`: the gate's reference plans."""
        return PrecisionPolicy(dtype, self.residual, {}, requested=self.requested, why="accuracy-gate reference")

    def unsupported(self, device: str, caps: Capabilities) -> Optional[str]:
        for group, kind in self.low_precision_groups().items():
            why = GEMM_KINDS[kind].unsupported(device, caps)
            if why:
                return f"{kind} for {group}: {why}"
        return None

    def summary(self) -> str:
        low = self.low_precision_groups()
        kinds = sorted(set(low.values()))
        return self.dtype + "".join(f" + {k} [{', '.join(g for g, v in low.items() if v == k)}]" for k in kinds)

    def cache_tag(self, groups: tuple[str, ...] = LAYER_GROUPS) -> str:
        """The GEMM kinds of `groups`, for a compile key (a graph without the head ignores it)."""
        return ",".join(f"{g}={self.gemm_kind(g)}" for g in sorted(groups))

    def describe(self) -> dict[str, object]:
        return {"summary": self.summary(), "dtype": self.dtype, "requested": self.requested or self.dtype,
                "why": self.why, "residual": self.residual, "gemm": {g: self.gemm_kind(g) for g in GEMM_GROUPS}}
