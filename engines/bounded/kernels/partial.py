"""Softmax attention split over disjoint key sets: each set's partial result and their
log-sum-exp merge. A beam step attends to [its request's prompt] + [its own suffix]; a
query's item to [the query] + [its own tokens]: in both the shared part is one matmul of
many rows against one K/V, the own part is per row group, and the merge is exact.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

Partial = tuple[Tensor, Tensor, Tensor]  # unnormalised output [..., D], row max [..., 1], row sum [..., 1]


def partial_softmax(scores: Tensor, v_matmul: Callable[[Tensor], Tensor]) -> Partial:
    """scores [..., N] float32 -> (v_matmul(exp(scores - max)), max, sum of the exps)."""
    m = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - m)
    return v_matmul(e), m, e.sum(-1, keepdim=True)


def merge_partials(a: Partial, b: Partial) -> Tensor:
    """The softmax attention over the union of the two key sets."""
    (oa, ma, la), (ob, mb, lb) = a, b
    m = torch.maximum(ma, mb)
    ea, eb = torch.exp(ma - m), torch.exp(mb - m)
    return (oa * ea + ob * eb) / (la * ea + lb * eb)
