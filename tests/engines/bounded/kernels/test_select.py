"""Choosing the next beams: the two-stage top-k against a full sort, and the per-request
widths and tries of `next_beams` against a plain per-request reference."""
from __future__ import annotations

import math

import torch

from engines.bounded.kernels import select
from engines.bounded.kernels.constraints import ROOT, build_trie


def test_top_continuations_equal_a_full_sort():
    torch.manual_seed(1)
    r, w, v, k = 2, 6, 640, 9
    logp = torch.log_softmax(torch.randn(r, w, v) * 3, -1)
    logp[:, :, 17] = -math.inf  # a banned token
    cum = torch.randn(r, w) - 5
    cum[1, 4:] = -math.inf  # dead rows
    scores, parent, token = select.top_continuations(logp, cum, k)
    want_scores, want_flat = torch.topk((logp + cum[:, :, None]).view(r, -1), k)
    assert torch.equal(scores, want_scores)
    assert torch.equal(parent * v + token, want_flat)


def test_next_beams_keep_each_requests_width_and_trie():
    torch.manual_seed(3)
    r, w_in, v, w = 3, 4, 50, 5
    logp = torch.log_softmax(torch.randn(r, w_in, v) * 2, -1)
    cum = torch.randn(r, w_in) - 3
    cum[2, 3] = -math.inf  # a dead beam
    trie = build_trie([(7, 1), (7, 2), (9, 3), (11, 4)], v)
    first = trie.continuations(torch.tensor([ROOT]))  # the nodes after tokens 7, 9, 11
    nodes = torch.zeros(r, w_in, dtype=torch.int64)
    nodes[1] = torch.tensor([ROOT, *first.node[:3].tolist()])
    scores, parents, tokens, new_nodes = select.next_beams(logp, cum, nodes, w, [None, trie, None], [4, 5, 5])
    for i, width in ((0, 4), (2, 5)):  # free: the best `width` of all w_in * V continuations
        want, flat = torch.topk((cum[i, :, None] + logp[i]).flatten(), width)
        assert torch.equal(scores[i, :width], want)
        assert torch.equal(parents[i, :width] * v + tokens[i, :width], flat)
        assert torch.isinf(scores[i, width:]).all()
    # constrained: every (beam, token) the trie allows from each beam's node, best first
    allowed = [(b, t) for b in range(w_in) for t in _children(trie, nodes[1, b].item())]
    ranked = sorted(allowed, key=lambda bt: -(cum[1, bt[0]] + logp[1, bt[0], bt[1]]).item())[:w]
    n = len(ranked)
    assert [(int(b), int(t)) for b, t in zip(parents[1, :n], tokens[1, :n])] == ranked
    assert torch.isinf(scores[1, n:]).all() and n == min(w, len(allowed))
    for b, t, node in zip(parents[1, :n].tolist(), tokens[1, :n].tolist(), new_nodes[1, :n].tolist()):
        c = trie.continuations(torch.tensor([nodes[1, b].item()]))
        assert node == c.node[c.token.tolist().index(t)].item()


def _children(trie, node: int) -> list[int]:
    return trie.continuations(torch.tensor([node])).token.tolist()
