"""The residual add and the RMSNorm after it, in one pass (model/decoder's packed-prefill
layer loop): x + delta -> (the new residual stream, its norm), the norm as the next GEMM takes
it -- bf16, or quantised per row for an int8 GEMM (kernels/int8.quantise_rows' pair). `delta`
may be an int8 GEMM's product with its rows' scales still to apply (bf16(product * scale),
as int8.int8_linear_quantised rounds it).

On a CPU with AVX512-BF16, a float32 residual stream and bf16 weights, the native kernels
(csrc/norms.cpp) do it reading and writing each row once; elsewhere (float32 plans, no
native library, a GPU) the graph's form below, which they match but for the order of the
sum of squares.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from engines.bounded.kernels import dense, int8, native


def add_rms_norm(x: Tensor, delta: Tensor, weight: Tensor, eps: float,
                 delta_scale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """x [T, H] residual, delta [T, H] (times delta_scale [T, 1] where given) -> (x + delta,
    rms_norm(x + delta) * weight in weight's dtype)."""
    if _native(x, delta, weight):
        return torch.ops.bounded_native.add_rms_norm_bf16(x, delta, delta_scale, weight, eps)
    x = x + _scaled(delta, delta_scale)
    return x, dense.rms_norm(x, weight, eps)


def add_rms_norm_quantised(x: Tensor, delta: Tensor, weight: Tensor, eps: float,
                           delta_scale: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """As `add_rms_norm`, the norm quantised per row -> (x + delta, u8 [T, H], float32 [T, 1])."""
    if _native(x, delta, weight):
        return torch.ops.bounded_native.add_rms_norm_quant_bf16(x, delta, delta_scale, weight, eps)
    x = x + _scaled(delta, delta_scale)
    q, scale = int8.quantise_rows(dense.rms_norm(x, weight, eps))
    return x, q, scale


def _scaled(delta: Tensor, scale: Optional[Tensor]) -> Tensor:
    return delta if scale is None else int8.cast(delta * scale, delta.dtype)


def _native(x: Tensor, delta: Tensor, weight: Tensor) -> bool:
    return (x.dtype == torch.float32 and delta.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
            and x.dim() == 2 and x.device.type == "cpu" and x.is_contiguous() and native.available())
