"""Layer modules of the bounded engine: thin nn.Module holders of weights around the dense
kernels, and the signature of the attention a decoder layer is given.

Weights are buffers (no autograd). `Linear` takes its GEMM kind from the precision policy,
so int8 or FP8 for a layer group is a choice made here at load, not in the model code.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Union

import torch
from torch import Tensor, nn

from engines.bounded.kernels import dense, int8, native, norms
from engines.bounded.model.precision import GEMM_KINDS, PrecisionPolicy

# attend(layer, q [T, Hq, D], k/v [T, Hkv, D]) -> [T, Hq*D]: the attention of one layer, given
# by the program that runs the decoder (it knows the packing, the cached K/V, the masks)
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]
# fused(qkv [T, (Hq + 2 Hkv) D] as projected, Hq, Hkv, q_norm/k_norm weights [D] or None, eps,
# the rotary tables cos/sin [P, D], positions [T], row_scale=None) -> [T, Hq*D]: attention that
# norms and rotates q/k itself (kernels/native.NativeAttention.fused); with row_scale [T, 1]
# (bf16), qkv is an int8 product whose rows it scales as it reads them
FusedAttend = Callable[..., Tensor]


class Quantised(NamedTuple):
    """A GEMM's input quantised per row (int8.quantise_rows' pair): u8 [T, K], float32 [T, 1]."""
    q: Tensor
    scale: Tensor


class Partial(NamedTuple):
    """A GEMM's output with its rows' scales not yet applied: bf16(product * scale) where
    `scale` is given (an int8 GEMM's, as int8.int8_linear_quantised rounds it), else product."""
    product: Tensor
    scale: Optional[Tensor] = None

    def value(self) -> Tensor:
        return self.product if self.scale is None else int8.cast(self.product * self.scale, self.product.dtype)


Normed = Union[Tensor, Quantised]  # a norm's output, as the GEMM after it takes it


class Linear(nn.Module):
    """y = x @ W.T (+ b) on a 2-D [T, K] input, with the GEMM kind the policy gives its group
    (dense, int8, fp8: precision.GEMM_KINDS), its weight prepared for that kind at load."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], kind: str = "dense"):
        super().__init__()
        self.kind = kind
        self._gemm = GEMM_KINDS[kind]
        self._names = []
        for name, t in self._gemm.prepare(weight).items():
            self.register_buffer(name, t)
            self._names.append(name)
        self.register_buffer("bias", bias)
        self.out_features = weight.shape[0]

    @classmethod
    def for_group(cls, group: str, weight: Tensor, bias: Optional[Tensor],
                  policy: PrecisionPolicy) -> "Linear":
        return cls(weight, bias, policy.gemm_kind(group))

    def forward(self, x: Tensor) -> Tensor:
        return self._gemm.linear(x, self.bias, **{n: getattr(self, n) for n in self._names})

    def partial(self, x: Normed) -> Partial:
        """The output with an int8 GEMM's row scales left to the residual add that takes it
        (norms.add_rms_norm): x [T, K] float, or already `Quantised` for an int8 GEMM."""
        if self.kind == "int8" and self.bias is None and self.weight.device.type == "cpu":
            q, scale = x if isinstance(x, Quantised) else int8.quantise_rows(x)
            dtype = torch.bfloat16 if isinstance(x, Quantised) else x.dtype  # only bf16 plans quantise in norms
            return Partial(int8.int8_product(q, self.weight, self.weight_scale, self.weight_zero, dtype), scale)
        if isinstance(x, Quantised):
            raise ValueError(f"a {self.kind} GEMM with bias {self.bias is not None} takes no quantised input")
        return Partial(self(x))

    def takes_quantised(self, dtype: torch.dtype) -> bool:
        """Whether `partial` and the fused attention take this GEMM's input `Quantised` (a bf16
        int8 GEMM without bias on a CPU with the native kernels, which the norm quantises)."""
        return (self.kind == "int8" and self.bias is None and dtype == torch.bfloat16
                and self.weight.device.type == "cpu" and native.available())


class GatedMLP(nn.Module):
    """down(silu(gate) * up), gate and up fused into one GEMM: [T, hidden] -> [T, hidden]."""

    def __init__(self, gate_up: Linear, down: Linear):
        super().__init__()
        self.gate_up, self.down = gate_up, down

    def forward(self, x: Tensor) -> Tensor:
        if self.takes_quantised(x.dtype):
            return self.partial(x).value()
        return self.down(dense.swiglu(self.gate_up(x)))

    def partial(self, x: Normed) -> Partial:
        """As forward, down's row scales left to the residual add (`Linear.partial`)."""
        if self.takes_quantised(torch.bfloat16 if isinstance(x, Quantised) else x.dtype):
            # int8 on both sides in bf16: gate_up's product scaled, SwiGLU and down's activation
            # quantisation in one native pass (csrc/swiglu.cpp), not three graph kernels
            up = self.gate_up.partial(x)
            return self.down.partial(Quantised(*torch.ops.bounded_native.swiglu_quant_bf16(up.product, up.scale)))
        if isinstance(x, Quantised):
            raise ValueError("this MLP takes no quantised input")
        return Partial(self(x))

    def takes_quantised(self, dtype: torch.dtype) -> bool:
        """Whether the MLP's middle is int8 on both sides (the norm before it quantises for it)."""
        return self.gate_up.takes_quantised(dtype) and self.down.kind == "int8" and self.down.bias is None


class RMSNorm(nn.Module):
    def __init__(self, weight: Tensor, eps: float):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", weight)

    def forward(self, x: Tensor) -> Tensor:
        return dense.rms_norm(x, self.weight, self.eps)

    def add_norm(self, x: Tensor, delta: Partial, quantise: bool = False) -> tuple[Tensor, Normed]:
        """The residual add before this norm with the norm, in one pass (kernels/norms): x [T, H]
        residual stream -> (x + delta, the norm of it: bf16, or `Quantised` for an int8 GEMM)."""
        if quantise:
            x, q, scale = norms.add_rms_norm_quantised(x, delta.product, self.weight, self.eps, delta.scale)
            return x, Quantised(q, scale)
        return norms.add_rms_norm(x, delta.product, self.weight, self.eps, delta.scale)


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
