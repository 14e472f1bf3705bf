"""Deterministic business requests from a scenario: synthetic text whose token length under
the model's tokenizer follows the scenario's distribution (independent samples, or a query
and its items), or requests from a JSONL file.

Request `i` depends only on the seed and `i`, so every engine sees the same requests in the
same order, however many it is sent.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from engines.base import BeamRequest, PrefillRequest, Request
from engines.validate import split_query
from harness.scenario import BeamTask, PrefillTask, Scenario, TokenDist


@dataclass(frozen=True)
class WorkItem:
    """A request plus what the harness needs to account for it."""

    request: Request
    # valid tokens of each sample (one entry for a beam prompt); a query request's samples
    # are its concatenations query + item_i, counted whole (what a per-sample engine computes)
    prompt_tokens: tuple[int, ...]
    query_tokens: int = 0  # the query's share of each sample, for a query request

    @property
    def samples(self) -> int:
        return len(self.prompt_tokens)


_WORD = re.compile(r"^Ġ[a-z]{3,10}$")


def single_token_words(tokenizer: Any) -> list[str]:
    """Lower-case words that are exactly one token with a leading space, sorted."""
    vocab = tokenizer.get_vocab()
    words = sorted(t[1:] for t in vocab if _WORD.match(t))
    if len(words) < 100:
        raise ValueError("tokenizer has too few single-token words for synthetic text")
    return words


class TextMaker:
    """Makes text of exactly n tokens: n words, each one token (' word')."""

    def __init__(self, tokenizer: Any):
        self.words = single_token_words(tokenizer)

    def text(self, rng: np.random.Generator, n: int) -> str:
        idx = rng.integers(0, len(self.words), size=n)
        return "".join(" " + self.words[i] for i in idx)


def draw_length(rng: np.random.Generator, dist: TokenDist | int) -> int:
    if isinstance(dist, int):
        return dist
    std = dist.std if dist.std is not None else (dist.max - dist.min) / 4
    return int(np.clip(round(rng.normal(dist.mean, std)), dist.min, dist.max))


def item_codes(tokenizer: Any, count: int, length: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """`count` distinct random codes of `length` word-token ids."""
    ids = np.array(sorted(tokenizer.convert_tokens_to_ids(["Ġ" + w for w in single_token_words(tokenizer)])))
    rng = np.random.default_rng(seed)
    codes = {tuple(int(t) for t in ids[rng.integers(0, len(ids), size=length)]) for _ in range(count)}
    while len(codes) < count:
        codes.add(tuple(int(t) for t in ids[rng.integers(0, len(ids), size=length)]))
    return tuple(sorted(codes))


class SyntheticWorkload:
    def __init__(self, scenario: Scenario, tokenizer: Any):
        self.scenario = scenario
        self.maker = TextMaker(tokenizer)
        task = scenario.task
        self.allowed = None
        if isinstance(task, BeamTask) and task.item_codes is not None:
            c = task.item_codes
            self.allowed = item_codes(tokenizer, c.count, c.length, c.seed)

        self._cache: list[WorkItem] = []

    def prefetch(self, n: int) -> None:
        """Make requests 0..n-1 now, so the load generator only looks them up."""
        while len(self._cache) < n:
            self._cache.append(self._make(len(self._cache)))

    def __getitem__(self, i: int) -> WorkItem:
        return self._cache[i] if i < len(self._cache) else self._make(i)

    def _make(self, i: int) -> WorkItem:
        wl, task = self.scenario.workload, self.scenario.task
        rng = np.random.default_rng([wl.seed, i])
        rid = f"{self.scenario.name}-{i}"
        if isinstance(task, PrefillTask) and wl.has_query:
            return self._query_request(rid, rng)
        if isinstance(task, PrefillTask):
            lengths = tuple(draw_length(rng, wl.prompt_tokens) for _ in range(wl.samples_per_request))
            samples = [self.maker.text(rng, n) for n in lengths]
            return WorkItem(PrefillRequest(rid, samples, list(task.labels)), lengths)
        n = draw_length(rng, wl.prompt_tokens)
        req = BeamRequest(rid, self.maker.text(rng, n), task.beam_width, task.decode_steps, self.allowed)
        return WorkItem(req, (n,))

    def _query_request(self, rid: str, rng: np.random.Generator) -> WorkItem:
        # words are single tokens with a leading space, so query + item tokenizes as the
        # query's tokens followed by the item's: the drawn lengths are exact
        wl = self.scenario.workload
        count = max(1, draw_length(rng, wl.items_per_request))
        q = draw_length(rng, wl.query_tokens)
        lengths = [draw_length(rng, wl.item_tokens) for _ in range(count)]
        query = self.maker.text(rng, q)
        items = [self.maker.text(rng, n) for n in lengths]
        req = PrefillRequest.with_query(rid, query, items, list(self.scenario.task.labels))
        return WorkItem(req, tuple(q + n for n in lengths), q)


def parse_request(obj: dict[str, Any], where: str) -> Request:
    """One JSONL line (the `bench infer` input format) -> a request."""
    try:
        kind, rid = obj["kind"], str(obj.get("id", where))
        if kind == "prefill_only" and "query" in obj:
            return _query_request(obj, rid, where)
        if kind == "prefill_only":
            return PrefillRequest(rid, list(obj["samples"]), list(obj["labels"]))
        if kind == "beam_search":
            allowed = obj.get("allowed")
            return BeamRequest(rid, obj["prompt"], int(obj["beam_width"]), int(obj["decode_steps"]),
                               tuple(tuple(c) for c in allowed) if allowed else None)
    except KeyError as e:
        raise ValueError(f"{where}: missing field {e.args[0]!r}") from None
    raise ValueError(f"{where}: unknown kind {obj.get('kind')!r}; kinds: prefill_only, beam_search")


def _query_request(obj: dict[str, Any], rid: str, where: str) -> PrefillRequest:
    """{"query": text | [ids], "items": [text | [ids], ...], "labels": [...]}: no samples."""
    if "samples" in obj:
        raise ValueError(f"{where}: give samples, or query + items, not both")
    query, items = obj["query"], obj["items"]
    if not isinstance(items, list) or not items:
        raise ValueError(f"{where}: items must be a non-empty list of texts or token id lists")
    text = isinstance(query, str)
    for k, piece in enumerate([query] + items):
        ok = isinstance(piece, str) if text else (
            isinstance(piece, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in piece))
        if not ok or not piece:
            what = "query" if k == 0 else f"items[{k - 1}]"
            raise ValueError(f"{where}: {what} must be a non-empty " + ("text (the query is text)" if text
                             else "list of token ids (the query is token ids)"))
    return PrefillRequest.with_query(rid, query, items, list(obj["labels"]))


def read_jsonl(path: str | Path) -> list[Request]:
    requests = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON: {e.msg}") from None
            requests.append(parse_request(obj, f"{path}:{n}"))
    return requests


def count_tokens(tokenizer: Any, sample: str | Sequence[int]) -> int:
    if isinstance(sample, str):
        return len(tokenizer.encode(sample, add_special_tokens=False))
    return len(sample)


class DatasetWorkload:
    def __init__(self, path: str | Path, tokenizer: Any):
        self.items = []
        for req in read_jsonl(path):
            if isinstance(req, PrefillRequest) and req.has_query:
                query, items = split_query(tokenizer, req.query, req.items)
                self.items.append(WorkItem(req, tuple(len(query) + len(i) for i in items), len(query)))
                continue
            texts = req.samples if isinstance(req, PrefillRequest) else [req.prompt]
            self.items.append(WorkItem(req, tuple(count_tokens(tokenizer, s) for s in texts)))
        if not self.items:
            raise ValueError(f"{path}: no requests")

    def prefetch(self, n: int) -> None:
        pass

    def __getitem__(self, i: int) -> WorkItem:
        return self.items[i % len(self.items)]


class Shifted:
    """Requests offset..offset+n-1 of a workload, indexed from 0 (made up front): each load
    point and SLO probe gets requests no earlier one sent, so a server's prefix cache cannot
    turn a repeat into a free answer."""

    def __init__(self, items, offset: int, n: int):
        if hasattr(items, "prefetch"):
            items.prefetch(offset + n)
        self.items, self.offset = items, offset

    def __getitem__(self, i: int):
        return self.items[self.offset + i]


def build_workload(scenario: Scenario, tokenizer: Any, base_dir: Path | None = None):
    """An indexable, deterministic source of WorkItems for `scenario`."""
    wl = scenario.workload
    if wl.dataset is not None:
        path = Path(wl.dataset)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return DatasetWorkload(path, tokenizer)
    return SyntheticWorkload(scenario, tokenizer)


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)
