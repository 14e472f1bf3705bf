"""Dense kernels: RMS norm, rotary embedding, SwiGLU, and the GEMMs (plain or FP8).

Shapes: T tokens (rows), H heads, D head dim, K/N a GEMM's input/output features.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.bounded.kernels import native


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # x: [..., D] (any float dtype); statistics in float32 like the HF reference, result in
    # weight.dtype (the GEMM dtype: a float32 residual stream is cast here)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(weight.dtype)


def rope_inv_freq(head_dim: int, theta: float) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def rope_tables(inv_freq: Tensor, max_positions: int) -> tuple[Tensor, Tensor]:
    # -> cos, sin: [max_positions, D] float32 (angles as in the HF reference: pos * inv_freq)
    pos = torch.arange(max_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [T, H, D]; cos/sin: [T, D] already in x.dtype
    cos, sin = cos[:, None, :], sin[:, None, :]
    return x * cos + rotate_half(x) * sin


def swiglu(gate_up: Tensor) -> Tensor:
    # gate_up: [T, 2I] (gate rows first, as fused at load) -> [T, I]; bf16 on a CPU where the
    # native kernels are loaded: their SwiGLU (csrc/swiglu.cpp, ~4x Inductor's fused kernel)
    if gate_up.dtype == torch.bfloat16 and gate_up.device.type == "cpu" and native.available():
        return torch.ops.bounded_native.swiglu_bf16(gate_up)
    # float32 where the AVX2 kernels are loaded: theirs (csrc/swiglu_f32.cpp, ~2x Inductor's:
    # its accurate exponential bounds the fused kernel)
    if gate_up.dtype == torch.float32 and gate_up.device.type == "cpu" and native.F32.available():
        return torch.ops.bounded_native_f32.swiglu_f32(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def dense_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    # x: [T, K] 2-D contiguous (a strided 3-D input makes F.linear copy the weight per call)
    return F.linear(x, weight, bias)


FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def fp8_quantise(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Rowwise float8_e4m3fn weight: weight [N, K] -> (w8 [N, K], scale [1, N] float32), one
    scale per output feature, for `fp8_linear`."""
    scale = (weight.float().abs().amax(-1).clamp(min=1e-12) / FP8_MAX)[None, :]  # [1, N]
    w8 = (weight.float() / scale.t()).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return w8, scale


def fp8_linear(x: Tensor, weight_fp8: Tensor, weight_scale: Tensor,
               bias: Optional[Tensor] = None) -> Tensor:
    """x [T, K] (bfloat16) @ dequantised weight.T -> [T, N] in x's dtype: dynamic rowwise
    activation scales [T, 1], the weight's rowwise scales [1, N], `torch._scaled_mm`
    (CUTLASS rowwise kernel on sm89/sm90: both operands e4m3, the weight column-major, K and
    N multiples of 16, bfloat16 output and bias)."""
    x_scale = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX  # [T, 1]
    x8 = (x.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return torch._scaled_mm(x8, weight_fp8.t(), scale_a=x_scale, scale_b=weight_scale,
                            bias=bias, out_dtype=x.dtype)
