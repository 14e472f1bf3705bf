"""The beam step's full-vocabulary head against log-softmax then masking."""
from __future__ import annotations

import math

import torch

from engines.bounded.kernels import head


def test_head_log_probs_match_log_softmax_then_mask():
    torch.manual_seed(2)
    hidden, weight = torch.randn(5, 16), torch.randn(300, 16)
    banned = torch.tensor([3, 299])
    got = head.head_log_probs(hidden, weight, banned, torch.empty(5, 300))
    want = torch.log_softmax(hidden @ weight.t(), -1)
    want[:, banned] = -math.inf
    assert torch.equal(got, want)
    w16 = weight.bfloat16()
    got16 = head.head_log_probs(hidden.bfloat16(), w16, banned, torch.empty(5, 300),
                                torch.empty(5, 300, dtype=torch.bfloat16))
    assert torch.allclose(got16[:, :3], want[:, :3], atol=0.2)
    packed = head.prepack_head(w16, 5)
    if packed is not None:  # oneDNN's prepacked GEMM: the same values
        got_packed = head.head_log_probs(hidden.bfloat16(), w16, banned, torch.empty(5, 300),
                                         torch.empty(5, 300, dtype=torch.bfloat16), packed)
        assert torch.allclose(got_packed, got16, atol=0.05)
