"""Item-code constraints for beam search: the allowed codes as a prefix trie in flat tensors.

Nodes are numbered depth by depth (root = 0); the children of a node are consecutive node
ids sorted by token, so a node's allowed next tokens are `token[first_child : first_child +
num_children]`. A beam carries the trie node of its generated prefix; one step turns the
nodes of all beams into their (beam, token, child node) continuations with tensor ops only
(no per-beam Python): `children` as a fixed-shape grid (each beam's children, padded to the
most any node of that depth has, so no size depends on device data and nothing syncs with
the host), `continuations` as the flat list. A beam whose node has no children (a code
shorter than the requested steps) has no continuation and drops out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

ROOT = 0


class ItemCodeError(ValueError):
    pass


@dataclass(frozen=True)
class Continuations:
    beam: Tensor  # [C] row of the parent beam
    token: Tensor  # [C] allowed next token
    node: Tensor  # [C] trie node after taking `token`


@dataclass(frozen=True)
class Children:
    token: Tensor  # [B, K] allowed next token (0 where not `valid`)
    node: Tensor  # [B, K] trie node after taking it (a valid node id where not `valid`)
    valid: Tensor  # [B, K] bool: the k-th child of the beam's node exists


@dataclass(frozen=True)
class ItemTrie:
    token: Tensor  # [N] token on the edge into each node (root: -1)
    first_child: Tensor  # [N] node id of the first child (any value when there is none)
    num_children: Tensor  # [N]
    depth: int  # longest code
    level_children: tuple[int, ...] = ()  # per depth (root: 0): the most children of any node there

    @property
    def num_nodes(self) -> int:
        return self.token.shape[0]

    def to(self, device: torch.device | str) -> "ItemTrie":
        """A copy on `device` (from pinned memory without waiting, when that is a GPU)."""
        device = torch.device(device)
        move = (lambda t: t.pin_memory().to(device, non_blocking=True)) if device.type == "cuda" \
            else (lambda t: t.to(device))
        return ItemTrie(move(self.token), move(self.first_child), move(self.num_children), self.depth,
                        self.level_children)

    def children(self, nodes: Tensor, depth: Optional[int] = None) -> Children:
        """nodes: [B] trie node of each beam -> each beam's children as a [B, K] grid, in token
        order; K: the most children of a node at `depth` (all of `nodes` lie there), or of any
        node when None. Fixed shapes: no device value decides a size."""
        k = max(self.level_children) if depth is None else \
            (self.level_children[depth] if depth < len(self.level_children) else 0)
        rank = torch.arange(max(k, 1), device=nodes.device)  # [K]
        valid = rank < self.num_children[nodes][:, None]  # [B, K]
        child = torch.where(valid, self.first_child[nodes][:, None] + rank, 0)
        token = torch.where(valid, self.token[child], 0)
        return Children(token, child, valid)

    def continuations(self, nodes: Tensor) -> Continuations:
        """nodes: [B] trie node of each beam -> every allowed (beam, token, child) triple,
        grouped by beam, tokens ascending within a beam."""
        counts = self.num_children[nodes]  # [B]
        beam = torch.repeat_interleave(torch.arange(nodes.shape[0], device=nodes.device), counts)  # [C]
        starts = torch.cumsum(counts, 0) - counts  # [B] first continuation of each beam
        rank = torch.arange(beam.shape[0], device=nodes.device) - starts[beam]  # [C] child rank
        child = self.first_child[nodes][beam] + rank
        return Continuations(beam, self.token[child], child)


def build_trie(codes: Sequence[Sequence[int]], vocab: int) -> ItemTrie:
    """The trie of `codes` (token-id sequences, lengths may differ), built from one
    lexicographic sort: at each depth a sorted row opens a new node where its prefix differs
    from the row before it. No Python loop over codes."""
    rows = _pad_codes(codes, vocab)  # [n, L], -1 past a code's end
    rows = rows[np.lexsort(rows.T[::-1])]  # lexicographic; a code sorts before its extensions
    n, depth = rows.shape
    changed = np.ones_like(rows, dtype=bool)
    changed[1:] = rows[1:] != rows[:-1]
    changed = np.maximum.accumulate(changed, axis=1)  # [n, L] prefix[: d+1] differs from row above
    tokens, firsts, counts = [np.array([-1])], [], []
    parent = np.zeros(n, dtype=np.int64)  # node of each row's prefix at the current depth
    level_start, level_size = 0, 1
    for d in range(depth):
        live = rows[:, d] >= 0
        opens = live & changed[:, d]  # rows that open a node at depth d + 1
        next_start = level_start + level_size
        node = next_start + np.cumsum(opens) - 1  # [n] node of each live row's prefix[: d+1]
        per_parent = np.bincount(parent[opens] - level_start, minlength=level_size)
        counts.append(per_parent)
        firsts.append(next_start + np.cumsum(per_parent) - per_parent)
        tokens.append(rows[opens, d])
        parent = np.where(live, node, -1)
        level_start, level_size = next_start, int(opens.sum())
    counts.append(np.zeros(level_size, dtype=np.int64))  # the deepest nodes are leaves
    firsts.append(np.zeros(level_size, dtype=np.int64))
    cat = lambda parts: torch.from_numpy(np.concatenate(parts).astype(np.int64))  # noqa: E731
    level_children = tuple(int(c.max()) if c.size else 0 for c in counts)
    return ItemTrie(cat(tokens), cat(firsts), cat(counts), depth, level_children)


def _pad_codes(codes: Sequence[Sequence[int]], vocab: int) -> np.ndarray:
    if not codes:
        raise ItemCodeError("allowed item codes are empty; give at least one code or none at all")
    lengths = np.fromiter((len(c) for c in codes), dtype=np.int64, count=len(codes))
    if lengths.min() < 1:
        raise ItemCodeError("an allowed item code is empty")
    flat = np.fromiter((t for c in codes for t in c), dtype=np.int64, count=int(lengths.sum()))
    if flat.min() < 0 or flat.max() >= vocab:
        raise ItemCodeError(f"item code tokens must be ids in 0..{vocab - 1}")
    if lengths.min() == lengths.max():
        return flat.reshape(len(codes), -1)
    rows = np.full((len(codes), int(lengths.max())), -1, dtype=np.int64)
    rows[np.arange(rows.shape[1])[None, :] < lengths[:, None]] = flat  # row-major fill
    return rows


class TrieCache:
    """Tries by the identity of the `allowed` object (the harness shares one object across
    requests), keeping the object alive so that its id stays unique."""

    def __init__(self, vocab: int, device: torch.device | str = "cpu", max_entries: int = 8):
        self.vocab, self.device, self.max_entries = vocab, device, max_entries
        self._tries: dict[int, tuple[object, ItemTrie]] = {}

    def get(self, allowed: Sequence[Sequence[int]]) -> ItemTrie:
        hit = self._tries.get(id(allowed))
        if hit is not None and hit[0] is allowed:
            return hit[1]
        trie = build_trie(allowed, self.vocab).to(self.device)
        if len(self._tries) >= self.max_entries:
            self._tries.pop(next(iter(self._tries)))
        self._tries[id(allowed)] = (allowed, trie)
        return trie
