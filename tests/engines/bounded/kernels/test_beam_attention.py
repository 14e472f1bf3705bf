"""Shared-prefix decode attention against attention over per-beam copies of the prompt, and
the native float32 step attention against the Python one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engines.bounded.kernels import beam_attention, native


def test_shared_prefix_attention_equals_attention_over_expanded_keys():
    torch.manual_seed(0)
    r, w, h, hkv, d, p, s = 3, 5, 6, 2, 8, 11, 4
    q = torch.randn(r, w, h, d)
    pk, pv = torch.randn(r, hkv, p, d), torch.randn(r, hkv, p, d)
    sk, sv = torch.randn(r * w, s, hkv, d), torch.randn(r * w, s, hkv, d)
    prompt_len = torch.tensor([11, 1, 6])
    valid_slots = torch.tensor([True, True, False, True])  # slot 2 unused, slot 3 the new token
    got = beam_attention.shared_prefix_attention(
        q, pk, pv, beam_attention.key_bias(torch.arange(p)[None, :] < prompt_len[:, None])[:, None, None, :],
        sk, sv, beam_attention.key_bias(valid_slots))
    # reference: every beam gets its own copy of the prompt K/V, one masked SDPA per beam
    for i in range(r * w):
        n = int(prompt_len[i // w])
        keys = torch.cat([pk[i // w, :, :n], sk[i][valid_slots].transpose(0, 1)], dim=1)  # [Hkv, n+S', D]
        vals = torch.cat([pv[i // w, :, :n], sv[i][valid_slots].transpose(0, 1)], dim=1)
        want = F.scaled_dot_product_attention(q.reshape(r * w, h, 1, d)[i], keys, vals, enable_gqa=True)
        assert torch.allclose(got[i], want.reshape(-1), atol=1e-5)


def _step_case(r, w, h, hkv, d, p, s, valid, seed=0):
    """A decode step's attention inputs; k/v the column slices of one qkv projection, as the
    graph hands them over."""
    g = torch.Generator().manual_seed(seed)
    b = r * w
    qkv = torch.randn(b, (h + 2 * hkv) * d, generator=g)
    q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.reshape(b, h, d), k.reshape(b, hkv, d), v.reshape(b, hkv, d)
    pk, pv = torch.randn(r, hkv, p, d, generator=g), torch.randn(r, hkv, p, d, generator=g)
    sk, sv = torch.randn(b, s, hkv, d, generator=g), torch.randn(b, s, hkv, d, generator=g)
    prompt_len = torch.randint(1, p + 1, (r,), generator=g)
    prompt_len[0] = 1  # a single prompt key (a padding request's)
    return q, k, v, pk, pv, prompt_len, sk, sv, torch.tensor(valid)


def _python_step(q, k, v, pk, pv, prompt_len, sk, sv, valid):
    r, s, p = pk.shape[0], sk.shape[1], pk.shape[2]
    slots = torch.arange(s + 1)
    prompt_bias = beam_attention.key_bias(torch.arange(p)[None, :] < prompt_len[:, None])[:, None, None, :]
    return beam_attention.shared_prefix_attention(
        q.reshape(r, -1, *q.shape[1:]), pk, pv, prompt_bias, torch.cat([sk, k[:, None]], 1),
        torch.cat([sv, v[:, None]], 1), beam_attention.key_bias((slots < valid) | (slots == s)))


@pytest.mark.parametrize("r,w,h,hkv,d,p,s,valid", [
    (1, 100, 14, 2, 64, 32, 5, 3),  # qwen2.5-0.5b's heads at W=100, three suffix slots filled
    (3, 5, 6, 2, 16, 11, 4, 0),  # the first decode step: no suffix yet; W not a multiple of the block
    (2, 9, 4, 4, 32, 40, 6, 6),  # every slot valid; g = 1
])
def test_native_step_attention_equals_the_python_one(r, w, h, hkv, d, p, s, valid):
    if not native.F32.load(lambda _: None):
        pytest.skip(f"native float32 kernels: {native.F32.status()}")
    args = _step_case(r, w, h, hkv, d, p, s, valid)
    got = torch.ops.bounded_native_f32.beam_attention_f32(*args)
    assert got.shape == (r * w, h * d)
    torch.testing.assert_close(got, _python_step(*args), atol=2e-6, rtol=1e-5)


def test_native_step_attention_refuses_what_it_cannot_read():
    if not native.F32.load(lambda _: None):
        pytest.skip(f"native float32 kernels: {native.F32.status()}")
    q, k, v, pk, pv, prompt_len, sk, sv, _ = _step_case(2, 3, 4, 2, 16, 8, 4, 1)
    op = torch.ops.bounded_native_f32.beam_attention_f32
    with pytest.raises(RuntimeError, match="suffix_len 5 outside 0..4"):
        op(q, k, v, pk, pv, prompt_len, sk, sv, torch.tensor(5))
    with pytest.raises(RuntimeError, match="prompt_len 9 outside 1..8"):
        op(q, k, v, pk, pv, torch.tensor([9, 1]), sk, sv, torch.tensor(1))
    with pytest.raises(RuntimeError, match="float32"):
        op(q.bfloat16(), k, v, pk, pv, prompt_len, sk, sv, torch.tensor(1))
