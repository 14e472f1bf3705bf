"""Layer modules of the bounded engine: thin nn.Module holders of weights around the dense
kernels, and the signature of the attention a decoder layer is given.

Weights are buffers (no autograd). `Linear` takes its GEMM kind from the precision policy,
so FP8 for a layer group is a choice made here at load, not in the model code.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from engines.bounded.kernels import dense
from engines.bounded.model.precision import PrecisionPolicy

# attend(layer, q [T, Hq, D], k/v [T, Hkv, D]) -> [T, Hq*D]: the attention of one layer, given
# by the program that runs the decoder (it knows the packing, the cached K/V, the masks)
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]


class Linear(nn.Module):
    """y = x @ W.T (+ b) on a 2-D [T, K] input, dense or FP8 per the policy's group kind."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], kind: str = "dense"):
        super().__init__()
        self.kind = kind
        if kind == "fp8":
            w8, scale = dense.fp8_quantise(weight)
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
            return dense.fp8_linear(x, self.weight, self.weight_scale, self.bias)
        return dense.dense_linear(x, self.weight, self.bias)


class GatedMLP(nn.Module):
    """down(silu(gate) * up), gate and up fused into one GEMM: [T, hidden] -> [T, hidden]."""

    def __init__(self, gate_up: Linear, down: Linear):
        super().__init__()
        self.gate_up, self.down = gate_up, down

    def forward(self, x: Tensor) -> Tensor:
        return self.down(dense.swiglu(self.gate_up(x)))


class RMSNorm(nn.Module):
    def __init__(self, weight: Tensor, eps: float):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", weight)

    def forward(self, x: Tensor) -> Tensor:
        return dense.rms_norm(x, self.weight, self.eps)


class Rope(nn.Module):
    """Rotary tables for positions [0, max_positions); `forward(positions)` -> cos, sin [T, D];
    `rotate(x, cos, sin)` applies them to x [T, H, D]."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        cos, sin = dense.rope_tables(dense.rope_inv_freq(head_dim, theta), max_positions)
        # cast once, as the reference casts cos/sin to the activation dtype
        self.register_buffer("cos", cos.to(device=device, dtype=dtype))
        self.register_buffer("sin", sin.to(device=device, dtype=dtype))

    @property
    def max_positions(self) -> int:
        return self.cos.shape[0]

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.cos[positions], self.sin[positions]

    @staticmethod
    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return dense.apply_rope(x, cos, sin)
