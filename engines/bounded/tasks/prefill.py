"""The prefill_only task: tokenize -> pack -> prefill -> score -> format.

`tokenize` is request-scoped (the shared request check, engines/validate.py, against the
bounds, so a bad request fails alone, before batching); the rest run once per merged batch
of requests. `PrefillUsage` is the batcher's rule: packed tokens, sequences and distinct
labels under the plan's budget.

A query request (query + items; sample i = query + item_i) is packed as its query followed
by its items, each item naming the query as its prefix: the query is prefilled once, and
each item attends to the query's K/V plus its own tokens (kernels/query_attention.py), so
the answer is that of its concatenation at the cost of the query once. With the engine
option `share_query: false` it is packed as its concatenations instead, like any samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from engines.base import PREFILL_ONLY, Bounds, EngineConfig, PrefillRequest, PrefillResult, RequestRejected
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.options import BoundedOptions
from engines.bounded.plan import Plan, PrefillPlan
from engines.bounded.runtime.buffers import PackedBatch, filler
from engines.bounded.runtime.prefill import PrefillRuntime
from engines.bounded.runtime.spans import span
from engines.bounded.tasks.base import Task
from engines.bounded.tasks.batcher import Pending
from engines.bounded.tasks.dag import Dag, Node
from engines.bounded.tasks.gate import Distance


@dataclass(frozen=True)
class ScoreItem:
    """One request, tokenized and checked (the request scope's output): the sequences it
    packs (`shared`: seqs[0] is a query the others continue, and is not scored)."""

    id: str
    seqs: list[list[int]]
    label_ids: list[int]
    shared: bool = False


@dataclass(frozen=True)
class ScoreBatch:
    """Several requests packed into one call."""

    packed: PackedBatch
    label_union: Tensor  # [N] the distinct label ids of all requests, on the device
    rows: list[tuple[int, int]]  # per request: its scored sequences' [start, end) in the batch
    cols: list[np.ndarray]  # per request: its labels' columns of label_union


class PrefillUsage:
    def __init__(self, budget: PrefillPlan):
        self.budget, self.seqs, self.tokens, self.labels = budget, 0, 0, set()

    def fits(self, p: Pending) -> bool:
        item: ScoreItem = p.item
        b = self.budget
        seqs = self.seqs + len(item.seqs)
        tokens = self.tokens + sum(map(len, item.seqs))
        labels = self.labels | set(item.label_ids)
        return seqs <= b.max_seqs and tokens <= b.max_tokens and len(labels) <= b.max_labels

    def add(self, p: Pending) -> None:
        self.seqs += len(p.item.seqs)
        self.tokens += sum(map(len, p.item.seqs))
        self.labels |= set(p.item.label_ids)

    def full(self) -> bool:
        return self.seqs >= self.budget.max_seqs or self.tokens >= self.budget.max_tokens


class PrefillTask(Task):
    kind = PREFILL_ONLY
    runtime: PrefillRuntime

    def __init__(self, runtime: PrefillRuntime, bounds: Bounds, plan: PrefillPlan, share_query: bool = True):
        self.share_query = share_query  # both attentions take a prefix (kernels/attention.py)
        super().__init__(runtime, bounds, plan, Dag([
            Node("tokenize", self.tokenize, ("request",), scope="request"),
            Node("pack", self.pack, ("items",)),
            Node("prefill", self.prefill, ("pack",)),
            Node("score", self.score, ("prefill", "pack")),
            Node("format", self.format, ("items", "score")),
        ], inputs={"request": ("request",), "batch": ("items",)}))

    @classmethod
    def create(cls, config: EngineConfig, policy: PrecisionPolicy, plan: Plan, options: BoundedOptions,
               log: Callable[[str], None]) -> "PrefillTask":
        runtime = PrefillRuntime(config.model_dir, policy, config.device, plan.prefill, options.compile, log,
                                 options.prefill_attention, options.kernel_profile)
        return cls(runtime, config.bounds, plan.prefill, options.share_query)

    def describe(self) -> dict:
        return {**super().describe(), "share_query": self.share_query}

    def usage(self) -> PrefillUsage:
        return PrefillUsage(self.plan)

    def warm_up(self) -> None:
        p = self.plan  # a small call: 3 sequences of 7 tokens (a query and two items), or what fits
        n = min(p.max_seqs, 3)
        seqs = [[0] * max(1, min(p.max_len // 2, 7, p.max_tokens // n))] * n
        self.run([ScoreItem("warm-up", seqs, [0, 1], shared=n > 1 and self.share_query)], {})

    # --- accuracy gate (tasks/gate.py) ------------------------------------------------------

    def calibration_items(self, seed: int = 0) -> list[ScoreItem]:
        """4 requests of up to 8 seeded random-token samples (up to 64 tokens) and 2 labels."""
        g, p = torch.Generator().manual_seed(seed), self.plan
        n = max(1, min(8, p.max_seqs))
        longest = max(1, min(p.max_len, 64, p.max_tokens // n))
        items = []
        for r in range(4):
            lengths = torch.randint(max(1, longest // 4), longest + 1, (n,), generator=g).tolist()
            seqs = [torch.randint(0, self.vocab, (k,), generator=g).tolist() for k in lengths]
            labels = torch.randint(0, self.vocab, (2,), generator=g).tolist()
            items.append(ScoreItem(f"calibration-{r}", seqs, sorted(set(labels))))
        return items

    @staticmethod
    def distance(reference: list[PrefillResult], got: list[PrefillResult]) -> Distance:
        p = torch.tensor([row for r in reference for row in r.scores])
        q = torch.tensor([row for r in got for row in r.scores])
        d = (p - q).abs()
        return Distance(d.mean().item(), d.max().item(), (p.argmax(-1) == q.argmax(-1)).float().mean().item())

    # --- nodes ----------------------------------------------------------------------------

    def tokenize(self, req: PrefillRequest) -> ScoreItem:
        checked = self.checker.prefill(req)  # types, ids, labels and bounds, as every engine checks
        labels = checked.labels
        if len(labels) > self.plan.max_labels:
            raise RequestRejected(f"{len(labels)} labels > {self.plan.max_labels} (engine option max_labels)")
        shared = self.share_query and checked.query_len > 0
        seqs = [checked.query] + checked.items if shared else checked.seqs
        total = sum(map(len, seqs))
        if total > self.plan.max_tokens or len(seqs) > self.plan.max_seqs:
            raise RequestRejected(f"{len(seqs)} sequences of {total} tokens exceed the batch budget of "
                                  f"{self.plan.max_seqs} sequences, {self.plan.max_tokens} tokens "
                                  "(engine options max_batch_seqs, max_batch_tokens)")
        return ScoreItem(req.id, seqs, labels, shared)

    def pack(self, items: list[ScoreItem]) -> ScoreBatch:
        union = sorted({t for it in items for t in it.label_ids})
        col = {t: i for i, t in enumerate(union)}
        rows, seqs, prefix = [], [], []
        for it in items:
            start = len(seqs)
            prefix += [-1] + [start] * (len(it.seqs) - 1) if it.shared else [-1] * len(it.seqs)
            seqs.extend(it.seqs)
            rows.append((start + it.shared, len(seqs)))  # a shared query is not scored
        extra = self._filler(sum(map(len, seqs)), len(seqs))
        if extra:  # an unscored sequence that rounds the token count up (runtime/buffers.TOKEN_BUCKET)
            seqs.append([0] * extra)
            prefix.append(-1)
        packed, labels = self.runtime.pack(seqs, union, prefix)
        return ScoreBatch(packed, labels, rows, [np.array([col[t] for t in it.label_ids]) for it in items])

    def _filler(self, tokens: int, seqs: int) -> int:
        """Tokens of the filler sequence of a CPU call (runtime/buffers.filler)."""
        p = self.plan
        return filler(tokens, seqs, p.max_tokens, p.max_seqs, p.max_len) if self.runtime.device.type == "cpu" else 0

    def prefill(self, batch: ScoreBatch) -> Tensor:
        return self.runtime.run(batch.packed, batch.label_union)  # [S, N_union]

    def score(self, logits: Tensor, batch: ScoreBatch) -> list[np.ndarray]:
        """Each request's softmax over its labels, in numpy (float64 from the float32 logits):
        a few dozen numbers, where a torch op's dispatch -- and, after a call that ran on
        one thread, the wake-up of the thread pool -- costs more than the arithmetic."""
        with span("bounded::select"):
            x = logits.numpy()
            probs = []
            for (a, b), cols in zip(batch.rows, batch.cols):
                z = x[a:b][:, cols].astype(np.float64)
                e = np.exp(z - z.max(axis=-1, keepdims=True))
                probs.append(e / e.sum(axis=-1, keepdims=True))
            return probs

    def format(self, items: list[ScoreItem], probs: list[np.ndarray]) -> list[PrefillResult]:
        return [PrefillResult(it.id, p.tolist()) for it, p in zip(items, probs)]
