"""Choosing the next beams: the exact top-W continuations of every beam of R requests at
once, and the constrained choice of one request whose codes are an item trie.

Shapes: R requests, W beam rows per request, V vocabulary, C allowed continuations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from engines.bounded.kernels.constraints import ItemTrie
from engines.bounded.kernels.head import HiddenRows, LogitRows


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


def top_continuations_of_logits(rows: LogitRows, cum: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """`top_continuations` from a head's LogitRows (no float32 log-probabilities): the same
    two stages, the blocks ranked by cum + (block_max - lse), then the chosen blocks' logits
    scored cum + (logit - lse). Both are that expression of a float32 value, which is
    monotone in it, so a block's best continuation scores exactly its block score."""
    r, w, v = rows.shape
    blk = rows.blk
    nb = v // blk
    nblocks = min(w * nb, k)
    block_score = cum[:, :, None] + (rows.block_max - rows.lse[:, :, None])  # [R, W, V/blk]
    _, top_blocks = torch.topk(block_score.view(r, w * nb), nblocks, dim=-1)  # [R, nblocks]
    parent = top_blocks // nb
    token = ((top_blocks % nb) * blk)[:, :, None] + torch.arange(blk, device=cum.device)  # [R, nblocks, blk]
    parent_rows = parent[:, :, None].expand_as(token).reshape(r, -1)
    cand = cum.gather(1, parent_rows) + rows.at(parent_rows, token.reshape(r, -1))  # [R, nblocks*blk]
    scores, pick = torch.topk(cand, min(k, nblocks * blk), dim=-1)
    return scores, parent_rows.gather(1, pick), token.reshape(r, -1).gather(1, pick)


def _top(logp: Tensor | LogitRows | HiddenRows, cum: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    if isinstance(logp, HiddenRows):  # the fused head: head, log-softmax and top-k in one pass
        return logp.top(cum, k)
    if isinstance(logp, LogitRows):
        return top_continuations_of_logits(logp, cum, k)
    return top_continuations(logp, cum, k)


def constrained_continuations(trie: ItemTrie, logp: Tensor, cum: Tensor, nodes: Tensor, w: int,
                              depth: Optional[int] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One request: logp [w_in, V], cum/nodes [w_in] (its beams' nodes at `depth` of the
    trie, or anywhere when None) -> the best min(w, w_in * K) continuations that stay on the
    trie: scores (-inf: none, a dead beam), parent rows, tokens, trie nodes (best first).
    Fixed shapes (K from the trie, not from the beams' nodes): nothing syncs with the host."""
    c = trie.children(nodes, depth)  # [w_in, K]
    total = cum[:, None] + logp.gather(1, c.token)  # [w_in, K]
    total = total.masked_fill(~c.valid, -math.inf)  # dead parents (-inf cum) stay -inf
    k = c.token.shape[1]
    total, flat = torch.topk(total.view(-1), min(w, total.numel()))
    return total, flat // k, c.token.view(-1)[flat], c.node.view(-1)[flat]


@dataclass(frozen=True)
class Choice:
    """How a batch chooses its beams, fixed once per batch (prepare_choice): which requests
    are free and which follow a trie, and which rows lie past each request's width."""

    width: int  # W rows per request
    free: Optional[Tensor]  # [F] device index of the free requests; None: every request is free
    num_free: int
    tries: tuple[tuple[int, ItemTrie], ...]  # (request, its trie) of the constrained ones
    past_width: Optional[Tensor]  # [R, W] bool on the device: rows past a request's width; None: none


def prepare_choice(tries: Sequence[Optional[ItemTrie]], widths: Sequence[int], w: int,
                   to_device: Callable[[list[int]], Tensor]) -> Choice:
    """The batch's Choice; `to_device(ints)` puts host ints on the device (the runtime's
    staging: pinned, one non-blocking copy)."""
    free = [i for i, trie in enumerate(tries) if trie is None]
    short = [i for i, width in enumerate(widths) if width < w]
    index = None if len(free) == len(tries) else to_device(free)
    past = None
    if short:
        limit = to_device(list(widths))  # [R]
        past = torch.arange(w, device=limit.device)[None, :] >= limit[:, None]
    return Choice(w, index, len(free), tuple((i, t) for i, t in enumerate(tries) if t is not None), past)


def next_beams(logp: Tensor | LogitRows | HiddenRows, cum: Tensor, nodes: Tensor, choice: Choice,
               depth: Optional[int] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The next [R, W] beams of R requests: logp [R, w_in, V] (log-probabilities, or the
    head's LogitRows or HiddenRows), cum/nodes [R, w_in] (nodes at
    `depth` of the tries); a free request takes the best of all its continuations, a
    constrained one only continuations on its trie, each keeps its own width.
    -> scores (-inf: dead or padding row), parent rows, tokens, trie nodes: [R, W] each."""
    r, w, device = logp.shape[0], choice.width, logp.device
    k = min(w, logp.shape[1] * logp.shape[2])
    common = choice.num_free == r and k == w  # the top-k is the whole answer
    if isinstance(logp, HiddenRows) and not common:  # a fused head's logits, for a choice that reads them
        logp = logp.materialise()
    if common:
        scores, parents, tokens = _top(logp, cum, k)
        new_nodes = torch.zeros(r, w, dtype=torch.int64, device=device)
    else:
        scores = torch.full((r, w), -math.inf, device=device)
        parents, tokens, new_nodes = (torch.zeros(r, w, dtype=torch.int64, device=device) for _ in range(3))
        if choice.num_free == r:
            scores[:, :k], parents[:, :k], tokens[:, :k] = _top(logp, cum, k)
        elif choice.num_free:
            idx = choice.free
            free = logp.requests(idx) if isinstance(logp, LogitRows) else logp[idx]
            scores[idx, :k], parents[idx, :k], tokens[idx, :k] = _top(free, cum[idx], k)
    for i, trie in choice.tries:
        rows = logp.requests(i).log_probs() if isinstance(logp, LogitRows) else logp[i]
        sc, par, tok, nod = constrained_continuations(trie, rows, cum[i], nodes[i], w, depth)
        n = sc.shape[0]
        scores[i, :n], parents[i, :n], tokens[i, :n], new_nodes[i, :n] = sc, par, tok, nod
    if choice.past_width is not None:
        scores = scores.masked_fill(choice.past_width, -math.inf)
    return scores, parents, tokens, new_nodes
