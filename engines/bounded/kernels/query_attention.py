"""Attention of a query's items in a packed prefill: each item token attends to [every token
of its query] + [its own item's tokens up to itself].

The query part is one matmul of all the items' rows against the query's single K/V (no copy
per item); the own part is per item; the two partial softmaxes are merged by log-sum-exp
(partial.py), as a beam step merges its prompt and suffix parts. attention.py runs these
per `Unit` (a query and its items, or a sequence alone) on its CPU workers.
Shapes: n rows, m keys, Hq query heads, Hkv K/V heads (g = Hq // Hkv), D head dim.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from engines.bounded.kernels.partial import Partial, merge_partials, partial_softmax

Span = tuple[int, int]


@dataclass(frozen=True)
class Unit:
    """One worker's share: a sequence's own causal attention (`own`), and/or `items` (a run of
    the sequences that continue it, back to back) attending to it as their prefix."""

    span: Span
    items: tuple[Span, ...] = ()
    own: bool = True

    @property
    def work(self) -> int:
        p = self.span[1] - self.span[0]
        return p * p * self.own + sum((e - s) * (p + e - s) for s, e in self.items)


def attention_units(spans: list[Span], prefix: Optional[list[int]], parts: int = 1) -> list[Unit]:
    """Share the attention out: each sequence alone, except that the items of a query (the
    sequences whose prefix it is, following it back to back) go in up to `parts` runs of
    about equal work, so one request's items spread over the workers too.
    prefix[i]: -1, or the index of i's prefix."""
    if prefix is None or all(p < 0 for p in prefix):
        return [Unit(s) for s in spans]
    items: dict[int, list[int]] = {}
    for i, p in enumerate(prefix):
        if p >= 0:
            if not 0 <= p < i or prefix[p] >= 0:
                raise ValueError(f"sequence {i}: prefix {p} must be an earlier sequence without a prefix")
            items.setdefault(p, []).append(i)
    units = []
    for i, span in enumerate(spans):
        if prefix[i] >= 0:
            continue
        units.append(Unit(span))
        own = items.get(i, [])
        if own and own != list(range(i + 1, i + 1 + len(own))):
            raise ValueError(f"the items of prefix {i} must follow it back to back, got {own}")
        units += [Unit(span, run, own=False) for run in _runs([spans[j] for j in own], span, parts)]
    return units


def _runs(items: list[Span], query: Span, parts: int) -> list[tuple[Span, ...]]:
    """Consecutive items cut into at most `parts` runs of about equal attention work."""
    if not items:
        return []
    p = query[1] - query[0]
    work = [(e - s) * (p + e - s) for s, e in items]
    target, runs, run, done = sum(work) / max(1, min(parts, len(items))), [], [], 0
    for span, w in zip(items, work):
        run.append(span)
        done += w
        if done >= target * (len(runs) + 1) and len(runs) < parts - 1:
            runs.append(tuple(run))
            run = []
    return runs + [tuple(run)] if run else runs


def head_rows(x: Tensor, hkv: int) -> Tensor:
    # [n, Hq, D] -> [Hkv, g*n, D]: the g query heads of each kv head stacked
    n, hq, d = x.shape
    return x.reshape(n, hkv, hq // hkv, d).permute(1, 2, 0, 3).reshape(hkv, -1, d)


def attend_items(out: Tensor, q: Tensor, k: Tensor, v: Tensor, unit: Unit, bias: Tensor, fp32: bool) -> None:
    """Write the attention of `unit`'s items into out [T, Hkv, g, D]; q/k/v: the packed [T, H, D]."""
    s, e = unit.span
    a, b = unit.items[0][0], unit.items[-1][1]
    shared = _against(q[a:b], k[s:e], v[s:e], fp32)  # every item row vs the query: [Hkv, g, I, D|1]
    for i, j in unit.items:
        own = _causal_partial(q[i:j], k[i:j], v[i:j], bias, fp32)
        part = tuple(x[:, :, i - a:j - a] for x in shared)
        out[i:j] = merge_partials(part, own).permute(2, 0, 1, 3)  # [n, Hkv, g, D]


def _scores(q: Tensor, k: Tensor, fp32: bool) -> Tensor:
    # q [n, Hq, D], k [m, Hkv, D] -> scaled float32 scores [Hkv, g*n, m]
    qs, ks = head_rows(q, k.shape[1]), k.transpose(0, 1)
    if fp32:
        qs, ks = qs.float(), ks.float()
    return torch.matmul(qs, ks.transpose(1, 2)).float() * q.shape[-1] ** -0.5


def _against(q: Tensor, k: Tensor, v: Tensor, fp32: bool) -> Partial:
    # rows q [n, Hq, D] against every key of k/v [m, Hkv, D] -> partial [Hkv, g, n, D|1]
    return _partial(_scores(q, k, fp32), v, q.shape[1] // k.shape[1])


def _causal_partial(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, fp32: bool) -> Partial:
    # one item against its own tokens, causally -> partial [Hkv, g, n, D|1]
    n, hkv, g = q.shape[0], k.shape[1], q.shape[1] // k.shape[1]
    scores = _scores(q, k, fp32).view(hkv, g, n, n) + bias[:n, :n]
    return _partial(scores.view(hkv, g * n, n), v, g)


def _partial(scores: Tensor, v: Tensor, g: int) -> Partial:
    # scores [Hkv, g*n, m] float32, v [m, Hkv, D] -> partial [Hkv, g, n, D|1]
    vs = v.transpose(0, 1)
    parts = partial_softmax(scores, lambda e: torch.matmul(e.to(v.dtype), vs).float())
    return tuple(x.view(x.shape[0], g, -1, x.shape[-1]) for x in parts)  # type: ignore[return-value]
