"""The native bf16 SwiGLU (csrc/swiglu.cpp) against silu(gate) * up computed in float64 and
rounded once to bf16, as the compiled graph's kernel rounds; and dense.swiglu's choice of it."""
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


def test_dense_swiglu_takes_the_native_kernel_for_bf16_only(swiglu):
    x = torch.randn(9, 2 * 40)
    torch.testing.assert_close(dense.swiglu(x), F.silu(x[:, :40]) * x[:, 40:], rtol=0, atol=0)  # float32: torch's
    xb = x.bfloat16()
    torch.testing.assert_close(dense.swiglu(xb), swiglu(xb), rtol=0, atol=0)
