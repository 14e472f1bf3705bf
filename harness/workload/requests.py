"""Deterministic business requests from a scenario: synthetic text whose token length under
the model's tokenizer follows the scenario's distribution (independent samples, or a query
and its items), or requests from a JSONL file.

Request `i` depends only on the seed and `i`, so every engine sees the same requests in the
same order, however many it is sent.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from engines.base import BeamRequest, Bounds as EngineBounds, PrefillRequest, Request, RequestRejected
from engines.validate import MAX_BEAM_WIDTH, MAX_DECODE_STEPS, CheckedPrefill, Limits, RequestChecker
from harness import strict_json
from harness.scenario.bounds import scenario_bounds
from harness.scenario.task import BeamTaskSpec, PrefillTaskSpec
from harness.scenario.schema import Scenario
from harness.scenario.fields import TokenDist


@dataclass(frozen=True)
class WorkItem:
    """A request plus what the harness needs to account for it."""

    request: Request
    # valid tokens of each sample (one entry for a beam prompt); a query request's samples
    # are its concatenations query + item_i, counted whole (what a per-sample engine computes)
    prompt_tokens: tuple[int, ...]
    query_tokens: int = 0  # the query's share of each sample, for a query request
    codes: frozenset[tuple[int, ...]] | None = None  # the item codes its beams should be (beam search)

    @property
    def samples(self) -> int:
        return len(self.prompt_tokens)


_WORD = re.compile(r"^Ġ[a-z]{3,10}$")


@functools.lru_cache(maxsize=4)  # a sweep builds a workload per cell from one tokenizer
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


@functools.lru_cache(maxsize=4)  # one object for every cell of a sweep (engines cache by id)
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
        self.allowed, self.codes = None, None
        if isinstance(task, BeamTaskSpec) and task.item_codes is not None:
            c = task.item_codes
            self.allowed = item_codes(tokenizer, c.count, c.length, c.seed)
            self.codes = code_set(self.allowed)
        self._cache: dict[int, WorkItem] = {}

    def prefetch(self, stop: int, start: int = 0) -> None:
        """Make requests start..stop-1 now, so the load generator only looks them up."""
        for i in range(start, stop):
            if i not in self._cache:
                self._cache[i] = self._make(i)

    def __getitem__(self, i: int) -> WorkItem:
        hit = self._cache.get(i)
        return hit if hit is not None else self._make(i)

    def _make(self, i: int) -> WorkItem:
        wl, task = self.scenario.workload, self.scenario.task
        rng = np.random.default_rng([wl.seed, i])
        rid = f"{self.scenario.name}-{i}"
        if isinstance(task, PrefillTaskSpec) and wl.has_query:
            return self._query_request(rid, rng)
        if isinstance(task, PrefillTaskSpec):
            lengths = tuple(draw_length(rng, wl.prompt_tokens) for _ in range(wl.samples_per_request))
            samples = [self.maker.text(rng, n) for n in lengths]
            return WorkItem(PrefillRequest(rid, samples, list(task.labels)), self._counted(lengths))
        n = draw_length(rng, wl.prompt_tokens)
        req = BeamRequest(rid, self.maker.text(rng, n), task.beam_width, task.decode_steps, self.allowed)
        return WorkItem(req, self._counted((n,)), codes=self.codes)

    def _counted(self, lengths: tuple[int, ...]) -> tuple[int, ...]:
        """Valid tokens as the engines see them (cut to the bounds when they truncate)."""
        b = self.scenario.bounds
        if b.on_violation != "truncate":
            return lengths
        return tuple(min(n, b.max_prompt_tokens) for n in lengths[: b.max_samples_per_request])

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
        b = scenario_bounds(self.scenario)
        if b.on_violation == "truncate":  # counted as the engines see them
            q, lengths = min(q, b.max_query_tokens), [min(n, b.max_item_tokens) for n in lengths]
            lengths = lengths[: b.max_samples_per_request]
        return WorkItem(req, tuple(q + n for n in lengths), q)


class LineError(ValueError):
    """One JSONL line that is not a request; the message names the line and the field."""

    def __init__(self, where: str, reason: str, id: Any = None):
        super().__init__(f"{where}: {reason}")
        self.reason, self.id = reason, id  # the line's id, when it has one that can be read


FIELDS = {  # kind -> (required, optional) fields; a prefill_only line has samples, or query + items
    "prefill_only": ({"kind", "labels"}, {"id", "samples", "query", "items"}),
    "beam_search": ({"kind", "prompt", "beam_width", "decode_steps"}, {"id", "allowed"}),
}


def parse_line(raw: bytes, where: str) -> tuple[Any, Request]:
    """One JSONL line (the `bench infer` input format) -> (its id as given, a request), or
    LineError. Field types and values are left to the engines' shared check
    (`engines.validate`), so a line and an HTTP body are judged alike."""
    try:
        obj = strict_json.loads(raw)
    except strict_json.BadJson as e:
        raise LineError(where, str(e)) from None
    return parse_request(obj, where)


def parse_request(obj: Any, where: str) -> tuple[Any, Request]:
    if not isinstance(obj, dict):
        raise LineError(where, f"a line must be one JSON object, got {type(obj).__name__}")
    rid = obj.get("id")
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))):
        raise LineError(where, f"field id: a string or an integer, got {json.dumps(rid)[:40]}")
    name = str(rid) if rid is not None else where
    kind = obj.get("kind")
    if kind not in FIELDS:
        raise LineError(where, f"field kind: {json.dumps(kind)[:40] if 'kind' in obj else 'missing'}; "
                        f"kinds: {', '.join(FIELDS)}", rid)
    required, optional = FIELDS[kind]
    missing = sorted(required - set(obj))
    unknown = sorted(set(obj) - required - optional)
    if missing:
        raise LineError(where, f"missing field {missing[0]!r} ({kind} needs {', '.join(sorted(required))})", rid)
    if unknown:
        raise LineError(where, f"unknown field {unknown[0]!r}; a {kind} line has "
                        f"{', '.join(sorted(required | optional))}", rid)
    if kind == "prefill_only":
        return rid, _prefill_request(obj, name, where, rid)
    allowed = obj.get("allowed")
    if isinstance(allowed, list):  # one shared, hashable object per line
        allowed = tuple(tuple(c) if isinstance(c, list) else c for c in allowed)
    return rid, BeamRequest(name, obj["prompt"], obj["beam_width"], obj["decode_steps"], allowed)


def _prefill_request(obj: dict[str, Any], name: str, where: str, rid: Any) -> PrefillRequest:
    """{"samples": [...], "labels": [...]} or {"query": text | [ids], "items": [...], "labels": [...]}."""
    query = "query" in obj or "items" in obj
    if query and "samples" in obj:
        raise LineError(where, "give samples, or query + items, not both", rid)
    need = ["query", "items"] if query else ["samples"]
    missing = [f for f in need if f not in obj or obj[f] is None]
    if missing:
        raise LineError(where, f"missing field {missing[0]!r} (prefill_only needs labels and samples, "
                        "or labels, query and items)", rid)
    if query:
        return PrefillRequest.with_query(name, obj["query"], obj["items"], obj["labels"])
    return PrefillRequest(name, obj["samples"], obj["labels"])


def read_lines(path: str | Path) -> Iterator[tuple[int, Any, Request | LineError]]:
    """(line number, id as given or None, request or the line's error) for each non-blank line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rid, req = parse_line(raw, f"{path}:{n}")
                yield n, rid, req
            except LineError as e:
                yield n, e.id, e


def read_jsonl(path: str | Path) -> list[Request]:
    """Every request of a JSONL file; the first bad line raises LineError."""
    requests = []
    for _n, _rid, req in read_lines(path):
        if isinstance(req, LineError):
            raise req
        requests.append(req)
    return requests


class DatasetWorkload:
    """Requests from a JSONL file (checked whole by harness.run.preflight first). Valid tokens
    are counted as the engines see them: after the bounds' truncation."""

    def __init__(self, path: str | Path, tokenizer: Any, bounds: EngineBounds = EngineBounds()):
        # counts only: whether a line fits the task's widths is the preflight's (and engines') call
        checker = RequestChecker(Limits(replace(bounds, max_beam_width=MAX_BEAM_WIDTH,
                                                max_decode_steps=MAX_DECODE_STEPS)), tokenizer)
        self.items = []
        for req in read_jsonl(path):
            try:
                checked = checker.check(req)
            except RequestRejected as e:
                raise ValueError(f"{path}: request {req.id}: {e}") from None
            seqs = checked.seqs if isinstance(checked, CheckedPrefill) else [checked.prompt]
            codes = code_set(req.allowed) if isinstance(req, BeamRequest) and req.allowed else None
            self.items.append(WorkItem(req, tuple(map(len, seqs)), getattr(checked, 'query_len', 0), codes))
        if not self.items:
            raise ValueError(f"{path}: no requests")

    def prefetch(self, stop: int, start: int = 0) -> None:
        pass

    def __getitem__(self, i: int) -> WorkItem:
        return self.items[i % len(self.items)]


class Shifted:
    """Requests offset..offset+n-1 of a workload, indexed from 0 (made up front): each load
    point and SLO probe gets requests no earlier one sent, so a server's prefix cache cannot
    turn a repeat into a free answer."""

    def __init__(self, items, offset: int, n: int):
        if hasattr(items, "prefetch"):
            items.prefetch(offset + n, offset)
        self.items, self.offset = items, offset

    def __getitem__(self, i: int):
        return self.items[self.offset + i]


def dataset_path(scenario: Scenario, base_dir: Path | None = None) -> Path | None:
    """The scenario's dataset file (relative paths are relative to the scenario's folder)."""
    if scenario.workload.dataset is None:
        return None
    path = Path(scenario.workload.dataset).expanduser()
    return base_dir / path if not path.is_absolute() and base_dir is not None else path


def code_set(codes) -> frozenset[tuple[int, ...]]:
    return frozenset(tuple(int(t) for t in c) for c in codes)


class Unconstrained:
    """The same requests without their item codes, for an engine the scenario runs
    unconstrained; each WorkItem keeps its codes, so the engine's beams can be checked."""

    def __init__(self, items):
        self.items = items

    def prefetch(self, stop: int, start: int = 0) -> None:
        if hasattr(self.items, "prefetch"):
            self.items.prefetch(stop, start)

    def __getitem__(self, i: int) -> WorkItem:
        item = self.items[i]
        if getattr(item.request, "allowed", None) is None:
            return item
        return replace(item, request=replace(item.request, allowed=None))


def build_workload(scenario: Scenario, tokenizer: Any, base_dir: Path | None = None):
    """An indexable, deterministic source of WorkItems for `scenario`."""
    path = dataset_path(scenario, base_dir)
    if path is not None:
        return DatasetWorkload(path, tokenizer, scenario_bounds(scenario))
    return SyntheticWorkload(scenario, tokenizer)


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)
