"""The native bf16 SwiGLU (csrc/swiglu.cpp) against silu(gate) * up computed in float64 and
rounded once to bf16, as the compiled graph's kernel rounds; the float32 one (csrc/swiglu_f32.cpp)
against float64 within a few ulp; and dense.swiglu's choice of them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engines.bounded.kernels import dense, native


@pytest.fixture(scope="module")
def swiglu():
    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU kernels unavailable here: {native.status()}")
    return torch.ops.bounded_native.swiglu_bf16


def _exact(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.double().chunk(2, -1)
    return g * torch.sigmoid(g) * u


@pytest.mark.parametrize("rows,inner", [(1, 16), (7, 100), (64, 4864), (300, 33)])
def test_native_swiglu_is_the_float_result_rounded_once(swiglu, rows, inner):
    g = torch.Generator().manual_seed(rows * inner)
    x = (torch.randn(rows, 2 * inner, generator=g) * 4).bfloat16()
    x[0, 0], x[-1, inner - 1] = -120.0, 95.0  # exp's clamped range: silu -> -0 and -> x
    got = swiglu(x)
    exact = _exact(x)
    assert got.shape == (rows, inner) and got.dtype == torch.bfloat16
    # one rounding of a result within ~1e-6 relative: the nearest bf16 or, at a tie's edge, its neighbour
    assert ((got.double() - exact).abs() <= exact.abs() * 2 ** -7 + 1e-30).all()
    assert (got != exact.bfloat16()).float().mean() < 1e-3


def test_native_swiglu_reads_a_strided_view_and_refuses_other_input(swiglu):
    wide = torch.randn(5, 3 * 48).bfloat16()
    view = wide[:, : 2 * 48]  # row stride 144, unit column stride
    torch.testing.assert_close(swiglu(view), swiglu(view.contiguous()), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="bfloat16 CPU"):
        swiglu(torch.randn(4, 32))
    with pytest.raises(RuntimeError, match="bfloat16 CPU"):
        swiglu(torch.randn(4, 31).bfloat16())


def test_dense_swiglu_takes_the_native_kernel_of_its_dtype(swiglu):
    x = torch.randn(9, 2 * 40)
    want = torch.ops.bounded_native_f32.swiglu_f32(x) if native.F32.available() else F.silu(x[:, :40]) * x[:, 40:]
    torch.testing.assert_close(dense.swiglu(x), want, rtol=0, atol=0)
    xb = x.bfloat16()
    torch.testing.assert_close(dense.swiglu(xb), swiglu(xb), rtol=0, atol=0)


@pytest.fixture(scope="module")
def swiglu_f32():
    if not native.F32.load(log=lambda _: None):
        pytest.skip(f"native float32 kernels unavailable here: {native.F32.status()}")
    return torch.ops.bounded_native_f32.swiglu_f32


@pytest.mark.parametrize("rows,inner", [(1, 5), (7, 100), (100, 4864), (300, 33)])
def test_native_float32_swiglu_is_within_a_few_ulp(swiglu_f32, rows, inner):
    g = torch.Generator().manual_seed(rows * inner)
    x = torch.randn(rows, 2 * inner, generator=g) * 4
    x[0, 0], x[-1, inner - 1] = -120.0, 95.0  # exp's ends: silu -> -0 and -> x
    got = swiglu_f32(x)
    exact = _exact(x)
    assert got.shape == (rows, inner) and got.dtype == torch.float32
    assert ((got.double() - exact).abs() <= exact.abs() * 2e-6 + 1e-30).all()  # ~16 ulp at most
    torch.testing.assert_close(dense.swiglu(x), got, rtol=0, atol=0)  # the graphs' SwiGLU is this one


def test_native_float32_swiglu_reads_a_strided_view_and_refuses_other_input(swiglu_f32):
    wide = torch.randn(5, 3 * 48)
    view = wide[:, : 2 * 48]
    torch.testing.assert_close(swiglu_f32(view), swiglu_f32(view.contiguous()), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="float32 CPU"):
        swiglu_f32(torch.randn(4, 32).double())
    with pytest.raises(RuntimeError, match="float32 CPU"):
        swiglu_f32(torch.randn(4, 31))


@pytest.mark.parametrize("rows,inner", [(1, 16), (7, 100), (64, 3072), (300, 33)])
def test_swiglu_quant_is_the_scaled_swiglu_quantised_per_row(swiglu, rows, inner):
    # the int8 MLP's middle: product * row scale, SwiGLU, then int8 per row as quantise_rows
    from engines.bounded.kernels import int8

    g = torch.Generator().manual_seed(rows + inner)
    product = (torch.randn(rows, 2 * inner, generator=g) * 40).bfloat16()
    scale = torch.rand(rows, 1, generator=g) * 0.1 + 1e-3
    product[0, 0] = -30000.0  # exp's clamped range: silu -> 0 there
    q, q_scale = torch.ops.bounded_native.swiglu_quant_bf16(product, scale)
    exact = _exact(product.double() * scale.double())
    want_scale = exact.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    assert q.dtype == torch.uint8 and q.shape == (rows, inner) and q_scale.shape == (rows, 1)
    assert ((q_scale.double() - want_scale).abs() <= want_scale * 1e-5).all()
    steps = exact / q_scale.double()  # the exact value in the row's steps
    assert ((q.double() - 128 - steps).abs() <= 0.5 + 1e-3).all()  # the nearest step (a tie either way)
    assert (q.long() - 128).abs().max() <= 127
    # what the graph did in three passes: scale to bf16, SwiGLU, quantise_rows
    q3, s3 = int8.quantise_rows(swiglu((product.float() * scale).bfloat16()))
    assert ((q.long() - q3.long()).abs() <= 1).all()
    torch.testing.assert_close(q_scale, s3, rtol=2 ** -6, atol=0)  # its two bf16 roundings


def test_swiglu_quant_refuses_other_input(swiglu):
    op = torch.ops.bounded_native.swiglu_quant_bf16
    with pytest.raises(RuntimeError, match="bfloat16 CPU"):
        op(torch.randn(4, 32), torch.ones(4, 1))
    with pytest.raises(RuntimeError, match="one value per row"):
        op(torch.randn(4, 32).bfloat16(), torch.ones(3, 1))
