"""The precision policy of the bounded engine: the dtype of weights and activations, of the
residual stream, and the GEMM kind of each layer group. The one place where a lower
precision (FP8 today) plugs in: layers.Linear asks it for its group's kind at load.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}

# The GEMM groups of a decoder layer, plus the scoring head. A precision policy may choose a
# different GEMM kind per group (e.g. FP8 for the MLP only).
GEMM_GROUPS = ("qkv", "o", "gate_up", "down")


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
