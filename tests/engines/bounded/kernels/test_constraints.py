"""The item-code trie against the plain dictionary trie the hf engine hands to
`prefix_allowed_tokens_fn`."""
from __future__ import annotations

import random

import pytest
import torch

from engines.bounded.kernels.constraints import ROOT, ItemCodeError, TrieCache, build_trie
from engines.hf import allowed_trie


def _walk(trie, node, prefix, seen):
    c = trie.continuations(torch.tensor([node]))
    seen[prefix] = c.token.tolist()
    for tok, child in zip(c.token.tolist(), c.node.tolist()):
        _walk(trie, child, prefix + (tok,), seen)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_prefix_allows_what_the_dict_trie_allows(seed):
    rng = random.Random(seed)
    # small alphabet: shared prefixes, codes that are prefixes of others, mixed lengths
    codes = [tuple(rng.randrange(30) for _ in range(rng.randint(1, 5))) for _ in range(400)]
    seen = {}
    _walk(build_trie(codes, 40), ROOT, (), seen)
    want = allowed_trie(codes)
    assert {k: v for k, v in seen.items() if v} == want


def test_continuations_of_many_beams_at_once():
    codes = [(5, 1, 2), (5, 1, 3), (5, 4, 0), (7, 7, 7)]
    trie = build_trie(codes, 10)
    first = trie.continuations(torch.tensor([ROOT]))
    five, seven = first.node.tolist()
    second = trie.continuations(torch.tensor([seven, five, five]))  # beams 0, 1, 2
    assert second.beam.tolist() == [0, 1, 1, 2, 2] and second.token.tolist() == [7, 1, 4, 1, 4]
    mask = _allowed_mask(trie, torch.tensor([ROOT, five]), 10)
    assert mask.nonzero().tolist() == [[0, 5], [0, 7], [1, 1], [1, 4]]
    leaf = trie.continuations(trie.continuations(second.node[:1]).node)
    assert leaf.beam.numel() == 0  # a complete code has no continuation


def test_bad_codes_are_errors():
    with pytest.raises(ItemCodeError, match="empty"):
        build_trie([], 10)
    with pytest.raises(ItemCodeError, match=r"ids in 0\.\.9"):
        build_trie([(1, 10)], 10)
    with pytest.raises(ItemCodeError, match="empty"):
        build_trie([(1,), ()], 10)


def test_cache_is_keyed_by_the_shared_object():
    cache = TrieCache(100)
    codes = ((1, 2), (3, 4))
    assert cache.get(codes) is cache.get(codes)
    assert cache.get(tuple(list(codes))) is not cache.get(codes)  # equal content, other object


def _allowed_mask(trie, nodes, vocab):
    """[B, vocab] bool: True where a beam may take the token."""
    c = trie.continuations(nodes)
    mask = torch.zeros(nodes.shape[0], vocab, dtype=torch.bool)
    mask[c.beam, c.token] = True
    return mask
