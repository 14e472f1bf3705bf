"""The residual add + RMSNorm in one pass (csrc/norms.cpp) against the same roundings done in
float64 (the add and the norm's statistics exact, then the graph's casts), the quantised forms
against int8.quantise_rows' formula, and kernels/norms' choice between native and graph."""
from __future__ import annotations

import pytest
import torch

from engines.bounded.kernels import native, norms

EPS = 1e-6


@pytest.fixture(scope="module")
def ops():
    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU kernels unavailable here: {native.status()}")
    return torch.ops.bounded_native


def _inputs(rows: int, hidden: int, scaled: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed + rows * hidden)
    x = torch.randn(rows, hidden, generator=g) * 3
    delta = (torch.randn(rows, hidden, generator=g) * (40 if scaled else 2)).bfloat16()
    scale = torch.rand(rows, 1, generator=g) / 20 + 1e-3 if scaled else None
    weight = (torch.rand(hidden, generator=g) + 0.5).bfloat16()
    return x, delta, scale, weight


def _reference(x, delta, scale, weight):
    """-> (x + delta float32, the normed value before its last rounding, float64)."""
    d = delta.float() if scale is None else (delta.float() * scale).bfloat16().float()
    new = x + d  # one float32 add, as the graph's
    inv = torch.rsqrt(new.double().pow(2).mean(-1, keepdim=True) + EPS)
    y = (new.double() * inv).float().bfloat16()  # xf.to(weight.dtype)
    return new, weight.double() * y.double()


def _quantise(h: torch.Tensor):
    """int8.quantise_rows' formula in float64: h [T, K] exact values -> (q + 128, scale)."""
    scale = (h.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127.0).float()
    return ((h / scale.double()).round().clamp(-127, 127) + 128).to(torch.uint8), scale


@pytest.mark.parametrize("rows,hidden", [(1, 16), (7, 72), (300, 1024), (33, 896)])
@pytest.mark.parametrize("scaled", [False, True])
def test_add_rms_norm_is_the_add_and_the_norm_rounded_as_the_graph_rounds(ops, rows, hidden, scaled):
    x, delta, scale, weight = _inputs(rows, hidden, scaled)
    new, h = ops.add_rms_norm_bf16(x, delta, scale, weight, EPS)
    want_new, exact = _reference(x, delta, scale, weight)
    assert new.dtype == torch.float32 and h.dtype == torch.bfloat16 and h.shape == (rows, hidden)
    assert torch.equal(new, want_new)
    # the statistics' sum order differs: a value next to a rounding edge may take its neighbour
    assert ((h.double() - exact).abs() <= exact.abs() * 2 ** -6 + 1e-30).all()
    assert (h != exact.bfloat16()).float().mean() < 2e-2


@pytest.mark.parametrize("rows,hidden", [(1, 16), (7, 72), (300, 1024)])
@pytest.mark.parametrize("scaled", [False, True])
def test_add_rms_norm_quant_is_the_norm_quantised_per_row(ops, rows, hidden, scaled):
    x, delta, scale, weight = _inputs(rows, hidden, scaled, seed=1)
    new, q, qs = ops.add_rms_norm_quant_bf16(x, delta, scale, weight, EPS)
    want_new, exact = _reference(x, delta, scale, weight)
    want_q, want_s = _quantise(exact.bfloat16().double())
    assert torch.equal(new, want_new) and q.dtype == torch.uint8 and qs.shape == (rows, 1)
    assert torch.allclose(qs, want_s, rtol=2 ** -7, atol=0)
    assert (q.int() - want_q.int()).abs().max() <= 1
    assert (q != want_q).float().mean() < 2e-2
    # and it is the bf16 form's output quantised, bit for bit: the same pass up to the norm
    _, h = ops.add_rms_norm_bf16(x, delta, scale, weight, EPS)
    q2, s2 = ops.quantise_rows_bf16(h)
    assert torch.equal(q, q2) and torch.equal(qs, s2)


@pytest.mark.parametrize("rows,cols", [(1, 16), (9, 100), (257, 2048)])
def test_quantise_rows_matches_the_formula(ops, rows, cols):
    g = torch.Generator().manual_seed(cols)
    x = (torch.randn(rows, cols, generator=g) * 5).bfloat16()
    x[0] = 0  # an all-zero row: the scale's floor, every q at zero
    q, s = ops.quantise_rows_bf16(x)
    want_q, want_s = _quantise(x.double())
    assert torch.equal(s, want_s)
    # bf16 inputs land on half steps often: there the product by 1/scale may round either way
    assert (q.int() - want_q.int()).abs().max() <= 1 and (q != want_q).float().mean() < 5e-3
    assert (q[0] == 128).all()


def test_the_ops_refuse_what_they_do_not_take(ops):
    x, delta, _, weight = _inputs(4, 32, False)
    with pytest.raises(RuntimeError, match="x must be a contiguous float32"):
        ops.add_rms_norm_bf16(x.bfloat16(), delta, None, weight, EPS)
    with pytest.raises(RuntimeError, match="delta must be bfloat16"):
        ops.add_rms_norm_quant_bf16(x, delta[:, :16], None, weight, EPS)
    with pytest.raises(RuntimeError, match="one value per row"):
        ops.add_rms_norm_bf16(x, delta, torch.ones(3, 1), weight, EPS)
    with pytest.raises(RuntimeError, match="bfloat16 CPU"):
        ops.quantise_rows_bf16(x)


def test_norms_takes_the_native_pass_only_where_it_applies(ops, monkeypatch):
    x, delta, scale, weight = _inputs(6, 64, True)
    calls = []
    namespace = torch.ops.bounded_native
    real = namespace.add_rms_norm_bf16

    class Ops:  # counts the native calls
        def __getattr__(self, name):
            calls.append(name)
            return getattr(namespace, name)

    monkeypatch.setattr(torch.ops, "bounded_native", Ops(), raising=False)
    new, h = norms.add_rms_norm(x, delta, weight, EPS, scale)
    assert calls == ["add_rms_norm_bf16"]
    graph_new, graph_h = norms.add_rms_norm(x, delta.float(), weight.float(), EPS)  # float32 plan: the graph form
    assert calls == ["add_rms_norm_bf16"] and graph_h.dtype == torch.float32
    assert torch.equal(graph_new, x + delta.float())
    assert torch.equal(new, real(x, delta, scale, weight, EPS)[0])
    # the graph form of the same bf16 inputs (forced): the same stream, the norm within a rounding
    monkeypatch.setattr(norms, "_native", lambda *a: False)
    g_new, g_h = norms.add_rms_norm(x, delta, weight, EPS, scale)
    assert torch.equal(g_new, new) and ((g_h.float() - h.float()).abs() <= h.float().abs() * 2 ** -7).all()
    _, gq, gs = norms.add_rms_norm_quantised(x, delta, weight, EPS, scale)
    assert gq.dtype == torch.uint8 and gs.shape == (6, 1)
