"""W8A8 GEMMs: int8 weights per output channel (quantised once, at load), 8-bit activations
per token (scaled at every call), integer accumulation, both scales applied on output.

How it reaches the fast kernel: oneDNN's int8 linear runs on VNNI/AMX only for unsigned
activations (u8 x s8; with signed int8 activations it takes a reference path, ~1,000x
slower here), so a token's int8 values q in [-127, 127] travel as u8 q + 128 with zero
point 128. `int8_linear` writes the product in the quantised-graph form of the PT2E flow --
`dequantize_per_tensor(x_u8, 1.0, 128)` and `dequantize_per_channel(w_int8, scale)` into a
linear -- which Inductor's freezing pass (x86, oneDNN built in) replaces by
`onednn::qlinear_pointwise` on a weight prepacked once; the per-token scale (pulled out of
the sum) and the bias are one multiply-add after it, which fuses with the activation
quantisation of the next GEMM's elementwise neighbours. In a bf16 graph both dequantised
operands are cast to bf16 first, so the kernel writes bf16 (its sum times the weight's scales,
rounded once; the token's scale after): half the bytes of float32 on the widest activation.
On a Xeon with AMX (2026-12-06) the float32 output ([1,312, 6,144], 32 MB for gate_up) held
the int8 plan at 0.82x the bf16 plan's speed on prefill_15, bf16 out brought it level, and
the weights' alignment (runtime/aligned.py) with the MLP's one-pass middle (`int8_product`,
model/layers.GatedMLP) took it to 1.21-1.38x (`bench run scenarios/prefill_15_int8.yaml
--engine bounded --engine bounded-int8 --requests 20`); the qkv product handed to the fused
attention with its row scales (model/decoder.DecoderLayer.attend_normed), 1.31-1.41x.
Eagerly the same code is a float GEMM on dequantised values (in bf16, the weight's rounded
to bf16): close to the same numbers, only slow. `int8_linear_packed` calls the prepacked
kernel directly, for the beam head that runs outside the graphs.

Shapes: T rows (tokens or beams), K input features, N output features.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)
import torch.nn.functional as F
from torch import Tensor

from engines.bounded.kernels import native
from engines.hardware import onednn_int8_exact

QMAX = 127.0  # symmetric int8 range [-127, 127]
ZERO = 128  # the u8 zero point the activations travel with

_qd = torch.ops.quantized_decomposed


def cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    # aten _to_copy, not .to(): under torch.export .to() adds a metadata check that uses its
    # input, and a quantisation pattern only matches nodes with a single user
    return torch.ops.aten._to_copy.default(x, dtype=dtype)


def int8_quantise(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [N, K] -> (int8 [N, K], float32 scale [N]): one symmetric scale per output row."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / QMAX
    return (w / scale[:, None]).round().clamp(-QMAX, QMAX).to(torch.int8), scale


def quantise_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [T, K] float -> (u8 [T, K] holding q + 128 for q in [-127, 127], float32 scale [T, 1]).
    bf16 on a CPU with the native kernels: theirs (csrc/norms.cpp), one read of x, where the
    graph's fused kernel ran at a third of the copy bandwidth."""
    if x.dtype == torch.bfloat16 and x.dim() == 2 and x.device.type == "cpu" and native.available():
        return torch.ops.bounded_native.quantise_rows_bf16(x)
    xf = cast(x, torch.float32)
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / QMAX
    return cast((xf / scale).round().clamp(-QMAX, QMAX) + ZERO, torch.uint8), scale


def int8_linear(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_zero: Tensor,
                bias: Optional[Tensor] = None) -> Tensor:
    """y = x @ W.T (+ b) in x's dtype: x [T, K] float; weight [N, K] int8, scale [N] float32,
    zero [N] int64 (zeros: the form the pattern wants)."""
    xq, x_scale = quantise_rows(x)
    return int8_linear_quantised(xq, x_scale, weight, weight_scale, weight_zero, bias, x.dtype)


def int8_linear_quantised(xq: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor, weight_zero: Tensor,
                          bias: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """`int8_linear` on activations already quantised (`quantise_rows`' pair), in `dtype`."""
    y = int8_product(xq, weight, weight_scale, weight_zero, dtype) * x_scale
    if bias is not None:
        y = y + bias
    return cast(y, dtype)


def int8_product(xq: Tensor, weight: Tensor, weight_scale: Tensor, weight_zero: Tensor, dtype: torch.dtype) -> Tensor:
    """q @ W.T times the weight's scales, without the tokens' (x_scale): [T, N], bf16 from
    the kernel where `dtype` is bf16, else float32."""
    xd = _qd.dequantize_per_tensor.default(xq, 1.0, ZERO, 0, 255, torch.uint8)  # [T, K] = q
    wd = _qd.dequantize_per_channel.default(weight, weight_scale, weight_zero, 0, -128, 127, torch.int8)
    if dtype == torch.bfloat16:  # the kernel writes bf16
        return F.linear(cast(xd, torch.bfloat16), cast(wd, torch.bfloat16))
    return F.linear(xd, wd)


def prepack(weight: Tensor) -> Optional[Tensor]:
    """An int8 weight [N, K] prepacked for oneDNN's int8 linear; None where oneDNN is not
    built in or is inexact (a CPU without VNNI or AMX: `onednn_int8_exact`)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available() or not onednn_int8_exact():
        return None
    return torch.ops.onednn.qlinear_prepack(weight, None)


def int8_linear_packed(x: Tensor, packed: Optional[Tensor], weight: Tensor, weight_scale: Tensor,
                       out: Optional[Tensor] = None) -> Tensor:
    """`int8_linear` without bias, eagerly, on a `prepack`ed weight (`weight` [N, K] int8 is
    read only where there is none): -> float32 [T, N], in `out` when given.

    With `out` the kernel accumulates into it (oneDNN's sum post-op on a zeroed buffer): a
    wide output (the beam head's [100, 151,936] is 61 MB) lands in planned memory instead
    of a fresh allocation whose first touch costs more than the zeroing (measured here:
    43.7 ms with the zeroing vs 57-72 ms into new memory at 100 rows)."""
    xq, x_scale = quantise_rows(x)
    if packed is None:
        q = cast(cast(xq, torch.int16) - ZERO, torch.int8)
        y = cast(torch._int_mm(q, weight.t()), torch.float32).mul_(weight_scale).mul_(x_scale)
        return y if out is None else out.copy_(y)
    if out is None:
        y = torch.ops.onednn.qlinear_pointwise(xq, 1.0, ZERO, packed, weight_scale, None, None, 1.0, 0,
                                               torch.float32, "none", [], "")
        return y.mul_(x_scale)
    y = torch.ops.onednn.qlinear_pointwise.binary(xq, 1.0, ZERO, packed, weight_scale, None, out.zero_(), None,
                                                  1.0, 0, torch.float32, 1.0, 0, "sum", 1.0, "none", [], "")
    if y.data_ptr() != out.data_ptr():  # a build that does not sum in place: the values are the same
        out.copy_(y)
    return out.mul_(x_scale)
