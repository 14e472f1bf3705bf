"""Shared-prefix decode attention against attention over per-beam copies of the prompt."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engines.bounded.kernels import beam_attention


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
