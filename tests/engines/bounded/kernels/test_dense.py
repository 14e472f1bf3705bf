"""The FP8 GEMM's numerics, checked on the CPU (torch._scaled_mm runs float8_e4m3fn there):
rowwise weight scales and per-token activation scales against a float32 matmul, and what
rowwise buys over one scale per tensor when one output row is large."""
from __future__ import annotations

import torch

from engines.bounded.kernels import dense


def _rel(got, want):  # per output feature
    return (got.float() - want).norm(dim=0) / want.norm(dim=0)


def test_fp8_rowwise_gemm_is_close_to_float32():
    torch.manual_seed(0)
    w = torch.randn(192, 128) * 0.02
    x = torch.randn(37, 128).bfloat16()
    bias = torch.randn(192).bfloat16()
    w8, scale = dense.fp8_quantise(w.bfloat16())
    assert w8.dtype == torch.float8_e4m3fn and scale.shape == (1, 192) and scale.dtype == torch.float32
    got = dense.fp8_linear(x, w8, scale, bias)
    want = x.float() @ w.t() + bias.float()
    assert got.dtype == torch.bfloat16 and got.shape == (37, 192)
    assert _rel(got, want).max().item() < 0.06  # e4m3: 3 mantissa bits on both operands


def test_rowwise_scales_keep_small_rows_precise_beside_a_large_one():
    torch.manual_seed(1)
    w = torch.randn(64, 128) * 0.02
    w[5] *= 1e5  # one output feature far larger than the rest (past e4m3's ~2.8e4 normal range)
    x = torch.randn(16, 128).bfloat16()
    want = x.float() @ w.t()
    w8, scale = dense.fp8_quantise(w.bfloat16())
    rowwise = _rel(dense.fp8_linear(x, w8, scale), want)
    # one scale for the whole tensor: the small rows fall below e4m3's normal range
    t_scale = w.abs().amax() / dense.FP8_MAX
    w8_t = (w / t_scale).to(dense.FP8)
    tensorwise = _rel(dense.fp8_linear(x, w8_t, t_scale.expand(1, 64).contiguous()), want)
    others = torch.arange(64) != 5
    assert rowwise[others].max() < 0.08 and rowwise[others].median() < 0.05
    assert tensorwise[others].median() > 3 * rowwise[others].median(), (tensorwise.median(), rowwise.median())
