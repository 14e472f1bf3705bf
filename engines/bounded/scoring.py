"""The prefill_only task as DAG nodes: tokenize -> pack -> prefill -> score -> format.

`tokenize` is request-scoped (it validates one business request against the bounds, so a
bad request fails alone, before batching); the rest run once per merged batch of requests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engines.base import Bounds, PrefillRequest, PrefillResult, RequestRejected
from engines.bounded.dag import Dag, Node
from engines.bounded.runtime import PrefillRuntime
from engines.tokens import apply_bounds, encode, label_ids


@dataclass(frozen=True)
class Limits:
    """What one request may take of a batch (besides the declared bounds)."""

    vocab: int
    max_labels: int
    max_tokens: int  # packed tokens of one call


class ScoringNodes:
    def __init__(self, tokenizer: Any, runtime: PrefillRuntime, bounds: Bounds, limits: Limits):
        self.tokenizer, self.runtime, self.bounds, self.limits = tokenizer, runtime, bounds, limits

    def tokenize(self, st: dict[str, Any]) -> dict[str, Any]:
        req: PrefillRequest = st["request"]
        labels = label_ids(self.tokenizer, req.labels)
        if not labels or len(labels) > self.limits.max_labels or len(set(labels)) != len(labels):
            raise RequestRejected(f"{len(labels)} labels {labels}: give 1..{self.limits.max_labels} "
                                  "distinct labels")
        texts = [s for s in req.samples if isinstance(s, str)]
        encoded = iter(self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
        seqs = [list(next(encoded)) if isinstance(s, str) else encode(self.tokenizer, s)
                for s in req.samples]
        seqs = apply_bounds(self.bounds, seqs)
        bad = [t for t in labels + [t for s in seqs for t in s] if not 0 <= t < self.limits.vocab]
        if bad:
            raise RequestRejected(f"token ids outside the vocabulary [0, {self.limits.vocab}): {bad[:5]}")
        total = sum(map(len, seqs))
        if total > self.limits.max_tokens:
            raise RequestRejected(f"{total} tokens exceed the batch budget of {self.limits.max_tokens} "
                                  "(engine option max_batch_tokens)")
        return {"seqs": seqs, "label_ids": labels}

    def pack(self, st: dict[str, Any]) -> dict[str, Any]:
        items = st["items"]
        union = sorted({t for it in items for t in it["label_ids"]})
        col = {t: i for i, t in enumerate(union)}
        rows, seqs = [], []
        for it in items:
            rows.append((len(seqs), len(seqs) + len(it["seqs"])))
            seqs.extend(it["seqs"])
        return {
            "packed": self.runtime.pack(seqs),
            "label_union": torch.tensor(union, dtype=torch.int64),
            "rows": rows,  # per request: its sequences' [start, end) in the batch
            "cols": [torch.tensor([col[t] for t in it["label_ids"]]) for it in items],
        }

    def prefill(self, st: dict[str, Any]) -> dict[str, Any]:
        return {"logits": self.runtime.run(st["packed"], st["label_union"])}  # [S, N_union]

    def score(self, st: dict[str, Any]) -> dict[str, Any]:
        logits = st["logits"]
        probs = [torch.softmax(logits[a:b][:, cols], dim=-1) for (a, b), cols in zip(st["rows"], st["cols"])]
        return {"probs": probs}

    def format(self, st: dict[str, Any]) -> dict[str, Any]:
        return {"results": [PrefillResult(it["request"].id, p.tolist())
                            for it, p in zip(st["items"], st["probs"])]}


def build_dag(nodes: ScoringNodes) -> Dag:
    return Dag(
        [
            Node("tokenize", nodes.tokenize, ("request",), ("seqs", "label_ids"), scope="request"),
            Node("pack", nodes.pack, ("items",), ("packed", "label_union", "rows", "cols")),
            Node("prefill", nodes.prefill, ("packed", "label_union"), ("logits",)),
            Node("score", nodes.score, ("logits", "rows", "cols"), ("probs",)),
            Node("format", nodes.format, ("items", "probs"), ("results",)),
        ],
        inputs={"request": ("request",), "batch": ("items",)},
    )
