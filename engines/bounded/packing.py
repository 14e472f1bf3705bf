"""Packing: the valid tokens of many sequences as one [T] sequence, and the one explicit
metadata object (`PackedBatch`) the hot path reads: positions, padded-view indices, last
rows. `PackBuffers` holds the index buffers, allocated once at start from the bounds; a
batch only fills a prefix of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor


@dataclass(frozen=True)
class PackedBatch:
    tokens: Tensor  # [T] int64 token ids, sequences back to back
    positions: Tensor  # [T] position of each token within its sequence
    pad_index: Tensor  # [S, L] packed row of (sequence, position); past the end: the last row
    unpad_index: Tensor  # [T] row of the flattened [S*L] padded view for each token
    last_index: Tensor  # [S] packed row of each sequence's last token
    spans: tuple[tuple[int, int], ...]  # host copy: (start, end) of each sequence
    cu_seqlens: Tensor  # [S+1] int64 on the host: sequence offsets (start of each, then T)

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_seqs(self) -> int:
        return len(self.spans)

    def graph_args(self) -> tuple[Tensor, ...]:
        """The tensors a padded-attention prefill graph takes, in its argument order."""
        return self.tokens, self.positions, self.pad_index, self.unpad_index, self.last_index

    def varlen_args(self) -> tuple[Tensor, ...]:
        """The tensors a varlen-attention prefill graph takes (programs.ScorePrefill)."""
        return self.tokens, self.positions, self.cu_seqlens, self.last_index


class PackBuffers:
    """Index buffers for up to `max_tokens` tokens in `max_seqs` sequences of at most
    `max_len` tokens each, on `device`."""

    def __init__(self, max_tokens: int, max_seqs: int, max_len: int, device: torch.device):
        self.max_tokens, self.max_seqs, self.max_len = max_tokens, max_seqs, max_len
        i64 = dict(dtype=torch.int64, device=device)
        self.tokens = torch.zeros(max_tokens, **i64)
        self.positions = torch.zeros(max_tokens, **i64)
        self.unpad_index = torch.zeros(max_tokens, **i64)
        self.last_index = torch.zeros(max_seqs, **i64)
        # no sequence is longer than the token budget, so S*L <= max_seqs * min(max_len, budget)
        self.pad_index = torch.zeros(max_seqs * min(max_len, max_tokens), **i64)
        self.cu_seqlens = torch.zeros(max_seqs + 1, dtype=torch.int64)  # host: read by the attention op

    def pack(self, seqs: Sequence[Sequence[int]]) -> PackedBatch:
        lengths = [len(s) for s in seqs]
        total, n, longest = sum(lengths), len(seqs), max(lengths)
        if n > self.max_seqs or total > self.max_tokens or longest > self.max_len or min(lengths) < 1:
            raise ValueError(f"batch of {n} sequences, {total} tokens, longest {longest} is outside "
                             f"the planned buffers ({self.max_seqs} sequences, {self.max_tokens} "
                             f"tokens, {self.max_len} per sequence, none empty)")
        flat = [t for s in seqs for t in s]
        meta = _index_arrays(torch.tensor(lengths), longest)
        tokens = _fill(self.tokens, torch.tensor(flat, dtype=torch.int64))
        positions = _fill(self.positions, meta["positions"])
        unpad = _fill(self.unpad_index, meta["unpad_index"])
        last = _fill(self.last_index, meta["last_index"])
        pad = _fill(self.pad_index, meta["pad_index"].reshape(-1)).view(n, longest)
        starts = meta["starts"].tolist()
        spans = tuple((s, s + l) for s, l in zip(starts, lengths))
        cu = _fill(self.cu_seqlens, torch.tensor(starts + [total], dtype=torch.int64))
        return PackedBatch(tokens, positions, pad, unpad, last, spans, cu)


def _fill(buffer: Tensor, values: Tensor) -> Tensor:
    view = buffer[: values.shape[0]]
    view.copy_(values)
    return view


def _index_arrays(lengths: Tensor, longest: int) -> dict[str, Tensor]:
    # lengths: [S] -> the index tensors of a PackedBatch (host side, int64)
    ends = lengths.cumsum(0)
    starts = ends - lengths
    seq_of_token = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # [T]
    positions = torch.arange(int(ends[-1])) - starts[seq_of_token]
    cols = torch.arange(longest)[None, :]  # [1, L]
    pad_index = starts[:, None] + torch.minimum(cols, lengths[:, None] - 1)  # [S, L]
    return {
        "starts": starts,
        "positions": positions,
        "pad_index": pad_index,
        "unpad_index": seq_of_token * longest + positions,
        "last_index": ends - 1,
    }


def pack(seqs: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> PackedBatch:
    """Pack without planned buffers (tests, tools)."""
    lengths = [len(s) for s in seqs]
    bufs = PackBuffers(sum(lengths), len(seqs), max(lengths), torch.device(device))
    return bufs.pack(seqs)
