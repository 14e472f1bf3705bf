"""Choosing the next beams: the two-stage top-k against a full sort, the per-request widths
and tries of `next_beams` against a plain per-request reference, and the fixed shapes the
choice runs at (no size taken from device data)."""
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
    choice = select.prepare_choice([None, trie, None], [4, 5, 5], w, _to_device)
    assert choice.free.tolist() == [0, 2] and choice.past_width[0].tolist() == [False] * 4 + [True]
    scores, parents, tokens, new_nodes = select.next_beams(logp, cum, nodes, choice)
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


def _to_device(values):  # the runtime's staging, on a CPU
    return torch.tensor(values, dtype=torch.int64)


def test_constrained_choice_has_fixed_shapes():
    """The grid of each beam's children is as wide as the widest node at that depth, whatever
    the beams' nodes are, and the choice returns min(w, beams x that width) rows: no shape
    depends on device values (so nothing syncs with the host and a graph could hold it)."""
    trie = build_trie([(1, 5), (1, 6), (1, 7), (2, 5), (3, 8)], 10)  # depth 1: children 3, 1, 1
    assert trie.level_children == (3, 3, 0)
    first = trie.continuations(torch.tensor([ROOT])).node  # the nodes after 1, 2, 3
    grid = trie.children(first[[2, 1]], depth=1)  # two beams on one-child nodes
    assert grid.token.shape == (2, 3) and grid.valid.tolist() == [[True, False, False]] * 2
    assert grid.token[:, 0].tolist() == [8, 5]
    logp = torch.log_softmax(torch.randn(2, 10), -1)
    cum = torch.tensor([-1.0, -math.inf])  # the second beam is dead
    scores, parents, tokens, _ = select.constrained_continuations(trie, logp, cum, first[[2, 1]], 4, depth=1)
    assert scores.shape == (4,)  # min(4, 2 x 3), whatever is alive
    assert scores[0] == cum[0] + logp[0, 8] and (parents[0], tokens[0]) == (0, 8)
    assert torch.isinf(scores[1:]).all()


def _logit_rows(logits, banned):
    from engines.bounded.kernels import head
    r, w, v = logits.shape
    flat = logits.clone().view(r * w, v)
    former = head.ban_logits(flat, torch.tensor(banned))
    lse, block_max = head.logit_summary(flat, former, head.block_size(v))
    return head.LogitRows(flat.view(r, w, v), lse.view(r, w), block_max.view(r, w, -1), head.block_size(v))


def test_the_logit_summary_chooses_what_the_log_probabilities_choose():
    # bf16 logits, a banned token, dead rows: the summarised head (no float32 log-probs)
    # picks the same continuations, with the scores log_softmax gives to float rounding
    torch.manual_seed(4)
    r, w, v, k = 3, 7, 1280, 11
    logits = (torch.randn(r, w, v) * 3).bfloat16()
    cum = torch.randn(r, w) - 4
    cum[2, 5:] = -math.inf
    rows = _logit_rows(logits, [17, 300])
    logp = torch.log_softmax(logits.float(), -1)
    logp[:, :, [17, 300]] = -math.inf
    want_scores, want_flat = torch.topk((logp + cum[:, :, None]).view(r, -1), k)
    scores, parent, token = select.top_continuations_of_logits(rows, cum, k)
    assert torch.equal(parent * v + token, want_flat)
    torch.testing.assert_close(scores, want_scores, rtol=0, atol=1e-5)
    assert not ((token == 17) | (token == 300)).any()
    # a constrained request reads materialised log-probabilities of its own rows
    torch.testing.assert_close(rows.requests(1).log_probs(), logp[1], rtol=0, atol=1e-5)


def test_next_beams_take_logit_rows_for_free_and_constrained_requests():
    torch.manual_seed(5)
    r, w_in, v, w = 2, 3, 192, 4
    logits = (torch.randn(r, w_in, v) * 2).bfloat16()
    cum = torch.randn(r, w_in) - 3
    logp = torch.log_softmax(logits.float(), -1)
    logp[:, :, 5] = -math.inf
    trie = build_trie([(7, 1), (7, 2), (9, 3)], v)
    nodes = torch.full((r, w_in), ROOT, dtype=torch.int64)
    choice = select.prepare_choice([None, trie], [4, 4], w, _to_device)
    got = select.next_beams(_logit_rows(logits, [5]), cum, nodes, choice, depth=0)
    want = select.next_beams(logp, cum, nodes, choice, depth=0)
    for g, x in zip(got[1:], want[1:]):
        assert torch.equal(g, x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
