"""The one strict check of a business request, shared by every engine, `bench serve` and
`bench infer`: types, ranges and the declared bounds, before any work is done.

`RequestChecker(limits, tokenizer).check(request)` returns the request as token ids
(`CheckedPrefill` / `CheckedBeam`) or raises `RequestRejected` with a message that names
the field. What it refuses:
- wrong types: a bool is not an int, a float is not a token id, a string is not a list of
  samples; an id outside `[0, vocab)`;
- prefill_only: no samples, an empty sample, fewer than two labels, a label that is not
  one token, two labels that are the same token; a query request (`query` + `items`)
  with samples too, an empty query or item, no items, a query and items not all text or
  all token ids;
- beam_search: an empty prompt, `beam_width` / `decode_steps` outside the bounds, a prompt
  plus its decode steps longer than the model's positions; with allowed item codes, a code
  that is not exactly `decode_steps` tokens long or holds an EOS id (EOS is masked during
  the steps, so such a code can never be generated), or a `beam_width` larger than the
  number of distinct codes (only that many complete beams exist);
- past the bounds: rejected, or cut to them when `on_violation` is "truncate" (the end of a
  sample, prompt, query or item is kept: the scored position stays; the first samples or
  items are kept). A query request's items count against `max_samples_per_request`, its
  query against `max_query_tokens`, each item against `max_item_tokens`, and each
  concatenation query + item (a sample) against `max_prompt_tokens`.

A query request comes back as its concatenations (`CheckedPrefill.seqs`, sample i = query
+ item_i, what an engine scoring samples computes) with `query_len`, the length of the
prefix they share (the query's tokens), for engines that compute the query once. Text is
tokenized as one string per sample (`split_query`).

Without a tokenizer (the noop engine, which must stay the harness's ceiling) text is only
checked to be non-empty: its samples come back as `[]` and its label strings as -1, checked
for distinctness as strings.
"""
from __future__ import annotations

import json
import numbers
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from engines.base import BeamRequest, Bounds, PrefillRequest, Request, RequestRejected, Sample
from engines.encode import FastEncoder

# Hard caps, whatever the bounds say: sizes an engine could never plan buffers for.
MAX_SAMPLES = 4096
MAX_BEAM_WIDTH = 4096
MAX_DECODE_STEPS = 64
MAX_LABELS = 4096


@dataclass(frozen=True)
class FieldNames:
    """How the fields are called where the request came from (in error messages)."""

    samples: str = "samples"
    query: str = "query"
    items: str = "items"
    labels: str = "labels"
    prompt: str = "prompt"
    beam_width: str = "beam_width"
    decode_steps: str = "decode_steps"
    allowed: str = "allowed"


@dataclass(frozen=True)
class Limits:
    """What a request is checked against: the model's vocabulary and positions, the engine's
    bounds, and the ids that are masked during beam steps."""

    bounds: Bounds = Bounds()
    vocab: int | None = None  # None: ids are not range-checked (no model at hand)
    max_positions: int | None = None
    eos: frozenset[int] = frozenset()

    @classmethod
    def for_model(cls, model_dir: str | Path, bounds: Bounds) -> "Limits":
        """Vocabulary size, maximum positions and EOS ids from a HF model directory."""
        cfg = _read_json(Path(model_dir) / "config.json")
        gen = _read_json(Path(model_dir) / "generation_config.json")
        eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return cls(bounds, cfg.get("vocab_size"), cfg.get("max_position_embeddings"), frozenset(eos))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class CheckedPrefill:
    id: str
    seqs: list[list[int]]  # token ids of each sample, within the bounds (query + item_i)
    labels: list[int]  # distinct label token ids
    query_len: int = 0  # a query request: every sample starts with the same query_len tokens

    @property
    def query(self) -> list[int]:
        return self.seqs[0][: self.query_len]

    @property
    def items(self) -> list[list[int]]:
        """Each sample past the shared query (the samples themselves without a query)."""
        return [s[self.query_len:] for s in self.seqs]


@dataclass(frozen=True)
class CheckedBeam:
    id: str
    prompt: list[int]
    beam_width: int
    decode_steps: int
    allowed: Sequence[Sequence[int]] | None  # the request's own object (engines cache by identity)


Checked = CheckedPrefill | CheckedBeam


@dataclass(frozen=True)
class _Codes:
    """What a request needs to know of one `allowed` object, found once per object."""

    distinct: int
    lengths: frozenset[int]
    problem: str  # "" when every code is a non-empty list of in-range, non-EOS ids


def is_int(x: Any) -> bool:
    """An integer that is not a bool (numpy integers included)."""
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def _ids_problem(ids: Any, vocab: int | None, what: str) -> str:
    """Why `ids` is not a non-empty list of token ids, or ""."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        return f"{what}: expected a list of token ids, got {type(ids).__name__}"
    if not ids:
        return f"{what}: empty"
    for k, t in enumerate(ids):
        if type(t) is not int and not is_int(t):
            return f"{what}.{k}: token ids are integers, got {t!r}"
    if vocab is not None:
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            return f"{what}: token id {int(bad)} outside [0, {vocab})"
    return ""


def _valid_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate, e.g. "\ud800" in JSON
        raise RequestRejected(f"{where}: not valid Unicode text (a lone surrogate at character {e.start})") from None


class RequestChecker:
    """Checks requests for one engine (or server): its limits, tokenizer and field names."""

    def __init__(self, limits: Limits, tokenizer: Any = None, names: FieldNames = FieldNames()):
        self.limits, self.tokenizer, self.names = limits, tokenizer, names
        self._labels: dict[tuple, list[int]] = {}
        self._codes: dict[int, tuple[object, _Codes]] = {}
        self._token_bytes: int | None = None
        # built here, at the engine's start: it learns the vocabulary's pieces (~0.9 s a process, encode.py)
        self._encoder = FastEncoder(tokenizer) if tokenizer is not None else None
        self._lock = threading.Lock()

    def check(self, request: Request) -> Checked:
        if isinstance(request, PrefillRequest):
            return self.prefill(request)
        if isinstance(request, BeamRequest):
            return self.beam(request)
        raise RequestRejected(f"not a request: {type(request).__name__}")

    # --- prefill_only -------------------------------------------------------------------

    def prefill(self, req: PrefillRequest) -> CheckedPrefill:
        labels = self.labels(req.labels)
        if req.has_query:
            return self._query_request(req, labels)
        seqs = self._samples(req.samples)
        return CheckedPrefill(req.id, seqs, labels)

    def _query_request(self, req: PrefillRequest, labels: list[int]) -> CheckedPrefill:
        n, b = self.names, self.limits.bounds
        if req.samples:
            raise RequestRejected(f"give {n.samples}, or {n.query} + {n.items}, not both")
        items = self._items_list(req.items, isinstance(req.query, str))
        self._pieces([req.query] + list(items), isinstance(req.query, str))
        if self.tokenizer is None and isinstance(req.query, str):
            return CheckedPrefill(req.id, [[] for _ in items], labels)  # noop: lengths unknown
        if isinstance(req.query, str):
            self._text_fits(req.query, n.query, b.max_query_tokens, "max_query_tokens")
            for k, item in enumerate(items):
                self._text_fits(item, f"{n.items}.{k}", b.max_item_tokens + b.max_query_tokens, "max_item_tokens")
        query, item_ids = split_query(self.tokenizer, req.query, items)
        cap = b.max_item_tokens
        if query:
            room = b.max_prompt_tokens - 1  # at least one token of an item after it
            cap_q, bound = (b.max_query_tokens, "max_query_tokens") if b.max_query_tokens <= room else \
                (room, f"max_prompt_tokens - 1 (room for an item)")
            query = self._fit(query, n.query, cap_q, bound=bound)
        else:  # text whose first tokens all merge across the boundary: nothing shared
            cap += b.max_query_tokens
        item_ids = [self._item(item, f"{n.items}.{k}", cap, len(query)) for k, item in enumerate(item_ids)]
        return CheckedPrefill(req.id, [query + item for item in item_ids], labels, len(query))

    def _item(self, item: list[int], where: str, cap: int, query: int) -> list[int]:
        """An item within max_item_tokens, and its concatenation with the query (a sample)
        within max_prompt_tokens."""
        item = self._fit(item, where, cap, extra=query, bound="max_item_tokens")
        room = self.limits.bounds.max_prompt_tokens - query
        if len(item) > room:
            if self.limits.bounds.on_violation != "truncate":
                raise RequestRejected(f"{where}: {len(item)} tokens + {query} query tokens > max_prompt_tokens "
                                      f"{self.limits.bounds.max_prompt_tokens}")
            item = item[-room:]
        return item

    def _items_list(self, items: Any, text: bool) -> Sequence[Any]:
        kind = f"{'text' if text else 'token id lists'}, like the {self.names.query}"
        return self._listed(items, self.names.items, "item", kind)

    def _listed(self, values: Any, name: str, what: str, kind: str) -> Sequence[Any]:
        """A non-empty list of samples or items, cut to max_samples_per_request when
        truncating (never past MAX_SAMPLES)."""
        b = self.limits.bounds
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise RequestRejected(f"{name}: expected a list of {what}s ({kind}), got {type(values).__name__}")
        if not values:
            raise RequestRejected(f"{name}: need at least one {what}")
        cap = min(b.max_samples_per_request, MAX_SAMPLES)
        if len(values) > cap:
            if b.on_violation != "truncate" or len(values) > MAX_SAMPLES:
                raise RequestRejected(f"{name}: {len(values)} {what}s > max_samples_per_request {cap}")
            values = values[:cap]
        return values

    def _pieces(self, pieces: list[Any], text: bool) -> None:
        """The query (pieces[0]) and each item: all non-empty text, or all token id lists."""
        for k, piece in enumerate(pieces):
            where = self.names.query if k == 0 else f"{self.names.items}.{k - 1}"
            if text:
                if not isinstance(piece, str):
                    raise RequestRejected(f"{where}: expected text like the {self.names.query}, "
                                          f"got {type(piece).__name__} (query and items: all text or all token ids)")
                if not piece:
                    raise RequestRejected(f"{where}: empty")
                bound = "max_query_tokens" if k == 0 else "max_item_tokens"
                self._text_fits(piece, where, getattr(self.limits.bounds, bound), bound)
                continue
            problem = _ids_problem(piece, self.limits.vocab, where)
            if problem:
                raise RequestRejected(problem + " (query and items: all text or all token ids)"
                                      if isinstance(piece, str) else problem)

    def labels(self, labels: Any) -> list[int]:
        name = self.names.labels
        if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
            raise RequestRejected(f"{name}: expected a list of labels (text or token ids), "
                                  f"got {type(labels).__name__}")
        key = tuple((type(x), x) for x in labels) if all(isinstance(x, (str, int)) for x in labels) else None
        hit = self._labels.get(key) if key is not None else None
        if hit is not None:
            return hit
        ids = self._label_ids(labels, name)
        if key is not None:
            with self._lock:  # one checker may serve several threads (bench serve tokenizes in a pool)
                if len(self._labels) >= 64:
                    self._labels.pop(next(iter(self._labels)))
                self._labels[key] = ids
        return ids

    def _label_ids(self, labels: Sequence[Any], name: str) -> list[int]:
        if len(labels) < 2:
            raise RequestRejected(f"{name}: need at least two labels (the softmax runs over them), "
                                  f"got {len(labels)}")
        if len(labels) > MAX_LABELS:
            raise RequestRejected(f"{name}: {len(labels)} labels > {MAX_LABELS}")
        ids, seen = [], {}
        for k, lab in enumerate(labels):
            tid = self._label_id(lab, f"{name}.{k}")
            key = lab if tid == -1 else tid
            if key in seen:
                raise RequestRejected(f"{name}.{k}: same token {key!r} as {name}.{seen[key]}; labels must be distinct")
            seen[key] = k
            ids.append(tid)
        return ids

    def _label_id(self, lab: Any, where: str) -> int:
        if is_int(lab):
            problem = _ids_problem([lab], self.limits.vocab, where)
            if problem:
                raise RequestRejected(problem.replace(f"{where}: token id", f"{where}: label id"))
            return int(lab)
        if not isinstance(lab, str):
            raise RequestRejected(f"{where}: a label is text or a token id, got {lab!r}")
        if not lab:
            raise RequestRejected(f"{where}: empty label")
        _valid_text(lab, where)
        if self.tokenizer is None:
            return -1
        enc = self.tokenizer.encode(lab, add_special_tokens=False)
        if len(enc) != 1:
            raise RequestRejected(f"{where}: label {lab!r} is {len(enc)} tokens {enc}; each label must be one token")
        return enc[0]

    def _samples(self, samples: Any) -> list[list[int]]:
        name, b = self.names.samples, self.limits.bounds
        samples = self._listed(samples, name, "sample", "text or token id lists")
        seqs = self._encode_all(samples, name)
        return [self._fit(s, f"{name}.{k}", b.max_prompt_tokens) if s is not None else []
                for k, s in enumerate(seqs)]

    def _encode_all(self, samples: Sequence[Any], name: str) -> list[list[int] | None]:
        texts = []
        for k, s in enumerate(samples):
            if isinstance(s, str):
                if not s:
                    raise RequestRejected(f"{name}.{k}: empty sample")
                self._text_fits(s, f"{name}.{k}", self.limits.bounds.max_prompt_tokens)
                texts.append(s)
            else:
                problem = _ids_problem(s, self.limits.vocab, f"{name}.{k}")
                if problem:
                    raise RequestRejected(problem)
        encoded = iter(self._encode_texts(texts))
        return [next(encoded) if isinstance(s, str) else [int(t) for t in s] for s in samples]

    def _text_fits(self, text: str, where: str, cap: int, bound: str = "max_prompt_tokens") -> None:
        """Refuse, without tokenizing it, text too long to be `cap` tokens whatever it encodes
        to: a token is at most as many bytes as the longest vocabulary entry (bounds that
        truncate keep the text: its end is what counts). Text must be valid Unicode."""
        _valid_text(text, where)
        if self.tokenizer is None or self.limits.bounds.on_violation == "truncate":
            return
        if self._token_bytes is None:
            self._token_bytes = longest_token_bytes(self.tokenizer)
        if len(text) > cap * self._token_bytes:
            raise RequestRejected(f"{where}: {len(text):,} characters are more than {bound} {cap} tokens "
                                  f"(a token here is at most {self._token_bytes} bytes)")

    def _encode_texts(self, texts: list[str]) -> list[list[int] | None]:
        if self.tokenizer is None or not texts:
            return [None] * len(texts)  # no tokenizer: the length of text is unknown
        # the tokenizer's own ids, short text from a piece cache; long text goes to the fast
        # tokenizer's batch encoder, which releases the GIL (the single-text `encode` holds it: a
        # long text stalled the server's event loop)
        return self._encoder.encode(texts)

    def _fit(self, seq: list[int], where: str, cap: int, extra: int = 0,
             bound: str = "max_prompt_tokens") -> list[int]:
        """`seq` within `cap` tokens (and the model's positions, counting `extra` more: a
        beam's decode steps, or the query before an item)."""
        if not seq:
            raise RequestRejected(f"{where}: encodes to no tokens")
        if len(seq) > cap:
            if self.limits.bounds.on_violation != "truncate":
                raise RequestRejected(f"{where}: {len(seq)} tokens > {bound} {cap}")
            seq = seq[-cap:]
        positions = self.limits.max_positions
        if positions is not None and len(seq) + extra > positions:
            before = "query tokens" if bound == "max_item_tokens" else "decode steps"
            what = f"{len(seq)} tokens" + (f" + {extra} {before}" if extra else "")
            raise RequestRejected(f"{where}: {what} > the model's {positions} positions")
        return seq

    # --- beam_search --------------------------------------------------------------------

    def beam(self, req: BeamRequest) -> CheckedBeam:
        n, b = self.names, self.limits.bounds
        width = self._count(req.beam_width, n.beam_width, min(b.max_beam_width, MAX_BEAM_WIDTH))
        steps = self._count(req.decode_steps, n.decode_steps, min(b.max_decode_steps, MAX_DECODE_STEPS))
        vocab = self.limits.vocab
        if vocab is not None and width > vocab - len(self.limits.eos):
            raise RequestRejected(f"{n.beam_width}: {width} > the {vocab - len(self.limits.eos)} tokens a "
                                  "first step can choose from")
        prompt = self._prompt(req.prompt, steps)
        if req.allowed is not None:
            self._check_codes(req.allowed, width, steps)
        return CheckedBeam(req.id, prompt, width, steps, req.allowed)

    def _count(self, value: Any, name: str, cap: int) -> int:
        if not is_int(value):
            raise RequestRejected(f"{name}: expected an integer, got {value!r}")
        if not 1 <= value <= cap:
            raise RequestRejected(f"{name}: {int(value)} outside 1..{cap}")
        return int(value)

    def _prompt(self, prompt: Any, steps: int) -> list[int]:
        name, b = self.names.prompt, self.limits.bounds
        if isinstance(prompt, str):
            if not prompt:
                raise RequestRejected(f"{name}: empty prompt")
            self._text_fits(prompt, name, b.max_prompt_tokens)
            seq = self._encode_texts([prompt])[0]
            if seq is None:
                return []
        else:
            problem = _ids_problem(prompt, self.limits.vocab, name)
            if problem:
                raise RequestRejected(problem)
            seq = [int(t) for t in prompt]
        return self._fit(seq, name, b.max_prompt_tokens, extra=steps)

    def _check_codes(self, allowed: Any, width: int, steps: int) -> None:
        name = self.names.allowed
        codes = self._codes_summary(allowed)
        if codes.problem:
            raise RequestRejected(codes.problem)
        if codes.lengths != {steps}:
            raise RequestRejected(f"{name}: every item code must be exactly {self.names.decode_steps} = {steps} "
                                  f"tokens long; got lengths {sorted(codes.lengths)}")
        if width > codes.distinct:
            raise RequestRejected(f"{name}: {self.names.beam_width} {width} > {codes.distinct} distinct item "
                                  "codes (only that many complete beams exist)")

    def _codes_summary(self, allowed: Any) -> _Codes:
        hit = self._codes.get(id(allowed))
        if hit is not None and hit[0] is allowed:
            return hit[1]
        summary = self._summarise_codes(allowed)
        with self._lock:
            if len(self._codes) >= 8:
                self._codes.pop(next(iter(self._codes)))
            self._codes[id(allowed)] = (allowed, summary)
        return summary

    def _summarise_codes(self, allowed: Any) -> _Codes:
        name, vocab, eos = self.names.allowed, self.limits.vocab, self.limits.eos
        if isinstance(allowed, (str, bytes)) or not isinstance(allowed, Sequence):
            return _Codes(0, frozenset(), f"{name}: expected a list of item codes (token id lists), "
                                          f"got {type(allowed).__name__}")
        if not allowed:
            return _Codes(0, frozenset(), f"{name}: no item codes; give at least one code or leave it out")
        lengths, distinct = set(), set()
        for k, code in enumerate(allowed):
            problem = _ids_problem(code, vocab, f"{name}.{k}")
            if problem:
                return _Codes(0, frozenset(), problem)
            code = tuple(int(t) for t in code)
            masked = eos.intersection(code)
            if masked:
                return _Codes(0, frozenset(), f"{name}.{k}: holds EOS id {min(masked)}, which is masked during "
                                              "the decode steps (that code could never be generated)")
            lengths.add(len(code))
            distinct.add(code)
        return _Codes(len(distinct), frozenset(lengths), "")


_LONGEST: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def longest_token_bytes(tokenizer: Any) -> int:
    """Bytes of the longest vocabulary entry (UTF-8 of its string form: an upper bound for a
    byte-level vocabulary), found once per tokenizer (reading the vocabulary takes ~0.5 s)."""
    try:
        return _LONGEST[tokenizer]
    except (KeyError, TypeError):
        pass
    most = max(len(t.encode("utf-8")) for t in tokenizer.get_vocab())
    try:
        _LONGEST[tokenizer] = most
    except TypeError:  # not weakly referenceable: recomputed per checker
        pass
    return most


def split_query(tokenizer: Any, query: Sample, items: Sequence[Sample]) -> tuple[list[int], list[list[int]]]:
    """(query ids, item ids) of a query request, so that query + item_i is sample i's ids.

    Token ids are taken as given. Text is tokenized as one string per sample (query + item,
    the semantics), so a tokenizer merge across the boundary cannot change the answer: the
    shared query part is the longest prefix all the concatenations have in common, at most
    the query's own tokens, leaving every item at least one token of its own.
    """
    if not isinstance(query, str):
        return [int(t) for t in query], [[int(t) for t in item] for item in items]
    cats = [list(c) for c in tokenizer([query + item for item in items] + [query],
                                       add_special_tokens=False)["input_ids"]]
    own = len(cats.pop())
    shared = min(own, min(map(len, cats)) - 1, _common_prefix(cats))
    return cats[0][:shared], [c[shared:] for c in cats]


def _common_prefix(seqs: list[list[int]]) -> int:
    first, n = seqs[0], min(map(len, seqs))
    return next((k for k in range(n) if any(s[k] != first[k] for s in seqs)), n)
