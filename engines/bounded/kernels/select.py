"""Choosing the next beams: the exact top-W continuations of every beam of R requests at
once, and the constrained choice of one request whose codes are an item trie.

Shapes: R requests, W beam rows per request, V vocabulary, C allowed continuations.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from engines.bounded.kernels.constraints import ItemTrie


def top_continuations(logp: Tensor, cum: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Unconstrained beam step for R requests at once, exact top-k without sorting W*V values.

    logp: [R, W, V] float32 log-probabilities of each beam's next token (banned at -inf);
    cum: [R, W] cumulative log-probability of each beam (-inf for a dead or padding row).
    Returns the best k of the W*V continuations cum[b] + logp[b, t] per request, best first:
    scores [R, k], parent beam [R, k], token [R, k]; a score of -inf marks a dead beam.

    Two stages: the maximum of each block of `blk` consecutive tokens, the top blocks by
    cum + block maximum, then the top k among those blocks' tokens. The k best blocks hold
    the k best continuations (float addition is monotone, so cum + max(block) is exactly the
    block's best score), and only k * blk values are sorted instead of W * V.
    """
    r, w, v = logp.shape
    blk = math.gcd(v, 64)
    nb = v // blk
    nblocks = min(w * nb, k)
    block_max = logp.view(r, w, nb, blk).amax(-1) + cum[:, :, None]  # [R, W, V/blk]
    _, top_blocks = torch.topk(block_max.view(r, w * nb), nblocks, dim=-1)  # [R, nblocks]: b * nb + c
    flat = (top_blocks * blk)[:, :, None] + torch.arange(blk, device=logp.device)  # [R, nblocks, blk]
    parent_cum = cum.gather(1, top_blocks // nb)[:, :, None]  # [R, nblocks, 1]
    cand = parent_cum + logp.view(r, w * v).gather(1, flat.view(r, -1)).view(r, nblocks, blk)
    scores, pick = torch.topk(cand.view(r, -1), min(k, nblocks * blk), dim=-1)
    index = flat.view(r, -1).gather(1, pick)  # b * V + t
    return scores, index // v, index % v


def constrained_continuations(trie: ItemTrie, logp: Tensor, cum: Tensor, nodes: Tensor,
                              w: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One request: logp [w_in, V], cum/nodes [w_in] -> the best <= w continuations that stay
    on the trie: scores, parent rows, tokens, trie nodes (best first)."""
    live = torch.nonzero(torch.isfinite(cum)).flatten()
    c = trie.continuations(nodes[live])
    parent = live[c.beam]
    total = cum[parent] + logp[parent, c.token]  # [C]
    total, order = torch.topk(total, min(w, total.shape[0]))
    keep = torch.isfinite(total)
    order = order[keep]
    return total[keep], parent[order], c.token[order], c.node[order]


def next_beams(logp: Tensor, cum: Tensor, nodes: Tensor, w: int, tries: Sequence[Optional[ItemTrie]],
               widths: Sequence[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The next [R, w] beams of R requests: logp [R, w_in, V], cum/nodes [R, w_in]; request
    i keeps `widths[i]` rows and, when `tries[i]` is set, only continuations on that trie.
    -> scores (-inf: dead or padding row), parent rows, tokens, trie nodes: [R, w] each."""
    r, device = len(tries), logp.device
    scores = torch.full((r, w), -math.inf, device=device)
    parents, tokens, new_nodes = (torch.zeros(r, w, dtype=torch.int64, device=device) for _ in range(3))
    free = [i for i, trie in enumerate(tries) if trie is None]
    if free:
        k = min(w, logp.shape[1] * logp.shape[2])
        idx = torch.tensor(free, device=device)
        args = (logp, cum) if len(free) == r else (logp[idx], cum[idx])
        scores[idx, :k], parents[idx, :k], tokens[idx, :k] = top_continuations(*args, k)
    for i, (trie, width) in enumerate(zip(tries, widths)):
        if trie is not None:
            sc, par, tok, nod = constrained_continuations(trie, logp[i], cum[i], nodes[i], w)
            n = sc.shape[0]
            scores[i, :n], parents[i, :n], tokens[i, :n], new_nodes[i, :n] = sc, par, tok, nod
        scores[i, width:] = -math.inf  # rows past the request's own width
    return scores, parents, tokens, new_nodes
