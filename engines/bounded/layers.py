"""Layer modules of the bounded engine: thin nn.Module holders of weights around kernels.py.

Weights are buffers (no autograd). `Linear` takes its GEMM kind from the precision policy,
so FP8 for a layer group is a choice made here at load, not in the model code.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from engines.bounded import kernels
from engines.bounded.config import PrecisionPolicy


class Linear(nn.Module):
    """y = x @ W.T (+ b) on a 2-D [T, K] input, dense or FP8 per the policy's group kind."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], kind: str = "dense"):
        super().__init__()
        self.kind = kind
        if kind == "fp8":
            w8, scale = kernels.fp8_quantise(weight)
            self.register_buffer("weight", w8)
            self.register_buffer("weight_scale", scale)
        else:
            self.register_buffer("weight", weight.contiguous())
        self.register_buffer("bias", bias)

    @classmethod
    def for_group(cls, group: str, weight: Tensor, bias: Optional[Tensor],
                  policy: PrecisionPolicy) -> "Linear":
        return cls(weight, bias, policy.gemm_kind(group))

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "fp8":
            return kernels.fp8_linear(x, self.weight, self.weight_scale, self.bias)
        return kernels.dense_linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, weight: Tensor, eps: float):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", weight)

    def forward(self, x: Tensor) -> Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)


class Rope(nn.Module):
    """Rotary tables for positions [0, max_positions); `forward(positions)` -> cos, sin [T, D]."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        cos, sin = kernels.rope_tables(kernels.rope_inv_freq(head_dim, theta), max_positions)
        # cast once, as the reference casts cos/sin to the activation dtype
        self.register_buffer("cos", cos.to(device=device, dtype=dtype))
        self.register_buffer("sin", sin.to(device=device, dtype=dtype))

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.cos[positions], self.sin[positions]
