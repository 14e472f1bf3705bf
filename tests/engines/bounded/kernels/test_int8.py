"""W8A8 int8 GEMMs against a float reference: the quantisation itself, the GEMM eagerly
(`_int_mm`), on a oneDNN-prepacked weight, and as the beam head."""
from __future__ import annotations

import pytest
import torch

from engines.bounded.kernels import head, int8
from engines.hardware import onednn_int8_exact


def _data(t=37, k=256, n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, k, generator=g), torch.randn(n, k, generator=g) / k**0.5


def _zero(q):
    return torch.zeros(q.shape[0], dtype=torch.int64)


def test_weight_quantisation_is_per_output_channel_and_within_half_a_step():
    _, w = _data()
    q, scale = int8.int8_quantise(w)
    assert q.dtype == torch.int8 and q.shape == w.shape
    assert scale.shape == (w.shape[0],) and q.abs().max() == 127
    back = q.float() * scale[:, None]
    assert ((back - w).abs() <= scale[:, None] / 2 + 1e-7).all()


def test_activations_travel_as_u8_with_zero_point_128():
    x, _ = _data()
    xq, xs = int8.quantise_rows(x)
    q = xq.long() - 128
    assert xq.dtype == torch.uint8 and q.abs().max() == 127 and xs.shape == (x.shape[0], 1)
    assert ((q * xs - x).abs() <= xs / 2 + 1e-6).all()


def test_int8_linear_is_the_integer_product_of_the_quantised_operands():
    x, w = _data()
    q, ws = int8.int8_quantise(w)
    xq, xs = int8.quantise_rows(x)
    exact = ((xq.long() - 128) @ q.long().t()).double() * xs.double() * ws.double()
    got = int8.int8_linear(x, q, ws, _zero(q))
    assert got.dtype == x.dtype
    assert torch.allclose(got.double(), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_against_float(dtype):
    x, w = _data(t=64, k=512, n=128)
    bias = torch.randn(128)
    ref = x @ w.t() + bias
    q, ws = int8.int8_quantise(w)
    got = int8.int8_linear(x.to(dtype), q, ws, _zero(q), bias.to(dtype)).float()
    rel = (got - ref).norm() / ref.norm()
    assert rel < 0.03, rel  # ~1 % for Gaussian data (per-token and per-channel int8 steps)
    assert rel > 1e-4  # it did quantise
    cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
    assert cos > 0.999


def test_prepacked_int8_linear_equals_the_unpacked_one():
    x, w = _data(t=20, k=128, n=300)
    q, ws = int8.int8_quantise(w)
    packed = int8.prepack(q)
    if torch.backends.mkldnn.is_available():
        assert (packed is not None) == onednn_int8_exact()
    got = int8.int8_linear_packed(x, packed, q, ws)
    assert got.dtype == torch.float32
    assert torch.allclose(got, int8.int8_linear(x, q, ws, _zero(q)), rtol=1e-5, atol=1e-5)
    unpacked = int8.int8_linear_packed(x, None, q, ws)  # torch._int_mm, where oneDNN is missing
    assert torch.allclose(unpacked, got, rtol=1e-5, atol=1e-5)
    for pk in (packed, None):  # into a planned buffer holding stale values: they are not summed in
        out = torch.full((20, 300), 7.0)
        assert int8.int8_linear_packed(x, pk, q, ws, out=out) is out
        assert torch.allclose(out, got, rtol=1e-5, atol=1e-5)


def test_int8_head_log_probs_against_float():
    hidden, w = _data(t=5, k=64, n=300)
    banned = torch.tensor([7])
    ref = torch.log_softmax(hidden @ w.t(), -1)
    h8 = head.Int8Head.of(w)
    got = head.log_probs_of(h8(hidden), banned, torch.empty(5, 300))
    assert torch.isinf(got[:, 7]).all()
    keep = torch.arange(300) != 7
    assert (got[:, keep] - ref[:, keep]).abs().max() < 0.05
    assert (got[:, keep].argmax(-1) == ref[:, keep].argmax(-1)).all()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available() or not onednn_int8_exact(),
                    reason="oneDNN's int8 linear (exact with VNNI or AMX only)")
def test_packed_int8_linear_into_out_where_onednn_returns_a_new_tensor(monkeypatch):
    # a oneDNN build whose sum post-op writes a new tensor instead of `out`: the values still land in `out`
    x, w = _data(t=6, k=64, n=200)
    q, ws = int8.int8_quantise(w)
    packed = int8.prepack(q)
    want = int8.int8_linear_packed(x, packed, q, ws)
    real = torch.ops.onednn.qlinear_pointwise.binary

    def not_in_place(*args):
        args = list(args)
        args[6] = args[6].clone()  # the accumulator: the caller's buffer stays as it was
        return real(*args)

    monkeypatch.setattr(torch.ops.onednn.qlinear_pointwise, "binary", not_in_place)
    out = torch.full((6, 200), 7.0)
    assert int8.int8_linear_packed(x, packed, q, ws, out=out) is out
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and onednn_int8_exact()),
                    reason="oneDNN's int8 linear needs VNNI or AMX (the graphs keep _int_mm elsewhere)")
def test_compiled_bf16_int8_linear_writes_bf16_from_the_int8_kernel():
    # a bf16 graph's int8 GEMM returns bf16 from oneDNN (half the bytes of float32 on the
    # widest activation, gate_up's), the float32 graph's float32; the values are int8_linear's
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    x, w = _data(t=48, k=128, n=64)
    q, ws = int8.int8_quantise(w)

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("q", q)
            self.register_buffer("ws", ws)
            self.register_buffer("zero", _zero(q))

        def forward(self, x):
            return int8.int8_linear(x, self.q, self.ws, self.zero)

    for dtype, out in ((torch.bfloat16, "torch.bfloat16"), (torch.float32, "torch.float32")):
        torch._dynamo.reset()
        with torch.no_grad(), config.patch(freezing=True):
            got, code = run_and_get_code(torch.compile(Linear().eval()), x.to(dtype))
        calls = [line for line in "".join(code).splitlines() if "qlinear_pointwise" in line and "(" in line]
        assert calls and all(out in line for line in calls), calls
        torch.testing.assert_close(got.float(), int8.int8_linear(x.to(dtype), q, ws, _zero(q)).float(),
                                   rtol=2e-2, atol=2e-2)
