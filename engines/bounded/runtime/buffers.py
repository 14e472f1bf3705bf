"""The planned buffers of both runtimes, allocated once at start from the plan; a batch only
fills a prefix of them.

Packing: the valid tokens of many sequences as one [T] sequence, and the one explicit
metadata object (`PackedBatch`) the hot path reads: positions, padded-view indices, last
rows, offsets, and each sequence's prefix (a query request's items name their query, whose
K/V they attend to and whose length their positions continue); `PackBuffers` builds it once
per batch on the host and sends it to the device in one non-blocking copy (staging.py). `BeamBuffers`: the prompt K/V (written once
per batch), each beam's suffix K/V in two ping-pong buffers, the head's output rows, the
decode step's inputs.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from engines.bounded.model.config import ModelConfig
from engines.bounded.plan import BeamPlan
from engines.bounded.runtime.staging import Staging


# On a CPU a call's token count is rounded up to a multiple of this with an unscored filler
# sequence (`filler`): oneDNN builds a GEMM kernel for each new row count (~0.7 ms a linear
# on the tiny model against 0.03 ms cached), and token counts vary call by call; rounded, a
# few shapes recur. The filler costs at most TOKEN_BUCKET - 1 tokens of work.
TOKEN_BUCKET = 32


def filler(tokens: int, seqs: int, max_tokens: int, max_seqs: int, max_len: int) -> int:
    """Tokens of a filler sequence that brings `tokens` in `seqs` sequences to a multiple of
    TOKEN_BUCKET, or 0: already one, or no room for it within the planned maxima."""
    n = -tokens % TOKEN_BUCKET
    return n if n and tokens + n <= max_tokens and seqs < max_seqs and n <= max_len else 0


@dataclass(frozen=True)
class PackedBatch:
    """A packed batch's metadata, on the device (views of the staging buffer)."""

    tokens: Tensor  # [T] int64 token ids, sequences back to back
    positions: Tensor  # [T] position of each token (after its sequence's prefix, if any)
    pad_index: Tensor  # [S, L] packed row of (sequence, position in prefix + own tokens); past the end: the last row
    unpad_index: Tensor  # [T] row of the flattened [S*L] padded view for each token
    last_index: Tensor  # [S] packed row of each sequence's last token
    spans: tuple[tuple[int, int], ...]  # host copy: (start, end) of each sequence
    cu_seqlens: Tensor  # [S+1] int64 sequence offsets (start of each, then T); the host's on a CPU
    prefix: Tensor  # [S] int64: -1, or the earlier sequence (a query) this one continues

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_seqs(self) -> int:
        return len(self.spans)

    def varlen_args(self) -> tuple[Tensor, ...]:
        """The metadata a packed prefill graph takes (programs/prefill.py, programs/beam.py),
        for either attention: cu_seqlens (per sequence, CPU) or the padded-view indices."""
        return self.tokens, self.positions, self.cu_seqlens, self.pad_index, self.unpad_index, self.last_index


class PackBuffers:
    """Metadata for up to `max_tokens` tokens in `max_seqs` sequences of at most `max_len`
    tokens each, on `device`: built on the host once per batch into one staging buffer and
    sent to the device in one non-blocking copy (`extra` slots more for the caller's own
    per-batch ints, e.g. label ids, through `self.staging.put` after `pack`)."""

    def __init__(self, max_tokens: int, max_seqs: int, max_len: int, device: torch.device, extra: int = 0,
                 max_positions: Optional[int] = None):
        self.max_tokens, self.max_seqs, self.max_len = max_tokens, max_seqs, max_len
        self.max_positions = max_positions or max_len  # an item's positions continue its query's
        # the padded view's rows are the concatenations prefix + own tokens, none longer than
        # the token budget, so S*L <= max_seqs * min(max_positions, budget)
        pad = max_seqs * min(self.max_positions, max_tokens)
        self.staging = Staging(3 * max_tokens + pad + 3 * max_seqs + 1 + extra, torch.device(device))

    def pack(self, seqs: Sequence[Sequence[int]], prefix: Optional[Sequence[int]] = None) -> PackedBatch:
        """Starts a batch on the staging buffer (anything `put` there later rides along).
        `prefix[i]`: -1, or the index of the earlier sequence (a query) that sequence i
        continues; the sequences naming one prefix follow it back to back."""
        lengths = [len(s) for s in seqs]
        total, n, longest = sum(lengths), len(seqs), max(lengths)
        prefix = list(prefix) if prefix is not None else [-1] * n
        if len(prefix) != n or any(p >= i or (p >= 0 and prefix[p] >= 0) for i, p in enumerate(prefix)):
            raise ValueError(f"prefix {prefix}: each entry -1 or an earlier sequence without a prefix")
        offset = [lengths[p] if p >= 0 else 0 for p in prefix]
        reach = max(o + l for o, l in zip(offset, lengths))
        if (n > self.max_seqs or total > self.max_tokens or longest > self.max_len or min(lengths) < 1
                or reach > self.max_positions):
            raise ValueError(f"batch of {n} sequences, {total} tokens, longest {longest}, positions up to "
                             f"{reach} is outside the planned buffers ({self.max_seqs} sequences, "
                             f"{self.max_tokens} tokens, {self.max_len} per sequence, {self.max_positions} "
                             "positions, none empty)")
        meta = _index_arrays(np.array(lengths, dtype=np.int64), np.array(prefix, dtype=np.int64))
        meta["tokens"] = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=total)
        meta["prefix"] = np.array(prefix, dtype=np.int64)
        st = self.staging
        st.begin()
        views = {}
        for name in ("tokens", "positions", "unpad_index", "last_index", "pad_index", "cu_seqlens", "prefix"):
            host, views[name] = st.reserve(meta[name].size)
            host.numpy()[:] = meta[name].reshape(-1)  # numpy: a few small arrays cost microseconds, not torch ops
        st.flush()
        ends = meta["cu_seqlens"][1:].tolist()
        spans = tuple((e - l, e) for e, l in zip(ends, lengths))
        tokens, positions, unpad, last, pad, cu, pre = views.values()
        return PackedBatch(tokens, positions, pad.view(n, reach), unpad, last, spans, cu, pre)


def _index_arrays(lengths: np.ndarray, prefix: np.ndarray) -> dict[str, np.ndarray]:
    # lengths, prefix: [S] -> the index arrays of a PackedBatch (host side, int64). A
    # sequence with a prefix continues it: its positions follow the prefix's, and its row of
    # the padded view is the concatenation prefix + own tokens (the prefix's K/V gathered,
    # not recomputed), so the padded attention's causal mask is the concatenation's.
    ends = lengths.cumsum()
    starts = ends - lengths
    has = prefix >= 0
    source = np.maximum(prefix, 0)
    offset = np.where(has, lengths[source], 0)  # [S] prefix length before each
    head = np.where(has, starts[source], 0)  # [S] the prefix's first row
    seq_of_token = np.repeat(np.arange(len(lengths)), lengths)  # [T]
    within = np.arange(int(ends[-1])) - starts[seq_of_token]  # [T] index within the own tokens
    longest = int((offset + lengths).max())  # L: the longest concatenation
    cols = np.arange(longest)[None, :]  # [1, L]
    own = starts[:, None] + np.minimum(np.maximum(cols - offset[:, None], 0), lengths[:, None] - 1)
    pad_index = np.where(cols < offset[:, None], head[:, None] + cols, own)  # [S, L]; past the end: the last row
    return {
        "cu_seqlens": np.concatenate([starts, ends[-1:]]),
        "positions": within + offset[seq_of_token],
        "pad_index": pad_index,
        "unpad_index": seq_of_token * longest + offset[seq_of_token] + within,
        "last_index": ends - 1,
    }


def pack(seqs: Sequence[Sequence[int]], device: torch.device | str = "cpu",
         prefix: Optional[Sequence[int]] = None) -> PackedBatch:
    """Pack into buffers of exactly this size (export examples, tests)."""
    lengths = [len(s) for s in seqs]
    bufs = PackBuffers(sum(lengths), len(seqs), max(lengths), torch.device(device), max_positions=2 * max(lengths))
    return bufs.pack(seqs, prefix)


def example_batch(n: int, length: int, device: torch.device) -> PackedBatch:
    """An export example of n sequences of `length` and `length - 1` tokens alternately:
    T != S * L, so export unifies no two dynamic dims."""
    return pack([[1] * (length - (i % 2)) for i in range(n)], device)


class BeamBuffers:
    """K/V and index buffers for `plan`, allocated once; batches use contiguous prefixes."""

    def __init__(self, cfg: ModelConfig, plan: BeamPlan, dtype: torch.dtype, device: torch.device):
        self.cfg, self.plan = cfg, plan
        f32 = dict(dtype=torch.float32, device=device)
        per_prompt = cfg.layers * cfg.kv_heads * plan.max_prompt * cfg.head_dim
        per_row = cfg.layers * plan.suffix_slots * cfg.kv_heads * cfg.head_dim
        self.prompt_kv = [torch.zeros(plan.max_requests * per_prompt, **f32) for _ in range(2)]
        self.suffix_kv = [[torch.zeros(plan.max_rows * per_row, **f32) for _ in range(2)]
                          for _ in range(2)]  # [ping|pong][k|v]
        self._suffix_views: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        # the prompts' metadata, and each batch's choice of beams (two [R] index lists) after it
        self.pack = PackBuffers(plan.max_requests * plan.max_prompt, plan.max_requests,
                                plan.max_prompt, device, extra=2 * plan.max_requests)
        # the head: log-probabilities of every row (float32), and its GEMM's own output dtype
        self.logp = torch.zeros(plan.max_rows * cfg.vocab, **f32)
        self.logits = None if dtype == torch.float32 else \
            torch.zeros(plan.max_rows * cfg.vocab, dtype=dtype, device=device)
        # a decode step's inputs (the static inputs of its CUDA graphs)
        i64 = dict(dtype=torch.int64, device=device)
        self.tokens = torch.zeros(plan.max_rows, **i64)
        self.positions = torch.zeros(plan.max_rows, **i64)
        self.prompt_len = torch.ones(plan.max_requests, **i64)  # >= 1: a padding request stays finite
        self.suffix_len = torch.zeros((), **i64)  # valid suffix slots of this step
        self.rows = torch.zeros(plan.max_rows, **i64)  # the source row of each beam's suffix K/V

    def nbytes(self) -> int:
        flat = [*self.prompt_kv, *(t for pair in self.suffix_kv for t in pair), self.logp]
        flat += [self.logits] if self.logits is not None else []
        return sum(t.numel() * t.element_size() for t in flat)

    def prompt_views(self, r: int, p: int) -> tuple[Tensor, Tensor]:
        c = self.cfg
        shape = (c.layers, r, c.kv_heads, p, c.head_dim)
        n = math.prod(shape)
        return tuple(t[:n].view(shape) for t in self.prompt_kv)  # type: ignore[return-value]

    def head_views(self, b: int) -> tuple[Tensor, Optional[Tensor]]:
        n = b * self.cfg.vocab
        logits = None if self.logits is None else self.logits[:n].view(b, -1)
        return self.logp[:n].view(b, -1), logits

    def suffix_views(self, which: int, b: int) -> tuple[Tensor, Tensor]:
        views = self._suffix_views.get((which, b))  # every step asks for two: made once a shape
        if views is None:
            c = self.cfg
            shape = (c.layers, b, self.plan.suffix_slots, c.kv_heads, c.head_dim)
            n = math.prod(shape)
            views = self._suffix_views[(which, b)] = tuple(t[:n].view(shape) for t in self.suffix_kv[which])
        return views  # type: ignore[return-value]
