"""Model shape and precision settings of the bounded engine, as frozen dataclasses.

`ModelConfig` is the architecture read from an HF `config.json` by a family builder
(families.py); `PrecisionPolicy` says which dtype (or GEMM kind) each layer group runs in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}

# The GEMM groups of a decoder layer, plus the scoring head. A precision policy may choose a
# different GEMM kind per group (e.g. FP8 for the MLP only).
GEMM_GROUPS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class ModelConfig:
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    tied_head: bool
    qkv_bias: bool
    qk_norm: bool

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    def non_embedding_params(self) -> int:
        h, i = self.hidden, self.intermediate
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        return self.layers * (attn + 3 * h * i)


@dataclass(frozen=True)
class PrecisionPolicy:
    """The dtype of weights/activations, and the GEMM kind per layer group.

    `gemm` maps a group of GEMM_GROUPS to "dense" (a plain matmul in `dtype`) or "fp8"
    (weights quantised to float8_e4m3fn at load, `torch._scaled_mm`; CUDA with compute
    capability >= 8.9 only). This object is the one place where FP8 plugs in.
    """

    dtype: str = "bfloat16"
    residual: str = "float32"  # dtype of the residual stream between layers
    gemm: dict[str, str] = field(default_factory=lambda: {g: "dense" for g in GEMM_GROUPS})

    def __post_init__(self) -> None:
        for name in (self.dtype, self.residual):
            if name not in DTYPES:
                raise ValueError(f"dtype {name!r} is not supported; choose one of {', '.join(DTYPES)}")
        for group, kind in self.gemm.items():
            if group not in GEMM_GROUPS or kind not in ("dense", "fp8"):
                raise ValueError(f"precision gemm {group}={kind!r}: groups are {', '.join(GEMM_GROUPS)}, "
                                 "kinds are dense, fp8")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def residual_torch_dtype(self) -> torch.dtype:
        return DTYPES[self.residual]

    def gemm_kind(self, group: str) -> str:
        return self.gemm.get(group, "dense")

    def describe(self) -> dict[str, object]:
        return {"dtype": self.dtype, "residual": self.residual, "gemm": dict(self.gemm)}
