"""The HTTP bodies `bench serve` speaks, in SGLang's shapes, and their translation to and from
engine requests and results.

- `POST /v1/score` (SGLang's scoring route): `query` + each of `items` is one sample (token
  lists concatenated, text joined before tokenizing, `item_first` swaps the order);
  `label_token_ids`; `apply_softmax` must be true: engines return label probabilities
  normalised over the label tokens. A non-empty query (query first) reaches the engine as a
  query request (`PrefillRequest.with_query`), so an engine may compute it once; an empty
  query, or `item_first`, sends the concatenations as plain samples.
- `POST /generate` with `sampling_params.beam_width` W > 1: beam search of exactly
  `max_new_tokens` tokens (EOS masked); the best `n` beams (default W) come back in
  `meta_info.beam_results[]` with `output_ids`, `text` and `meta_info.sequence_score` =
  cumulative log-prob / length, as SGLang reports it. Without `beam_width` (or with 1) it is
  greedy decoding, answered in SGLang's plain shape.

Bodies are validated strictly (unknown fields, wrong types, out-of-bound sizes are 400s with a
message that names the field) before anything reaches the engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engines.base import BeamRequest, BeamResult, Bounds, PrefillRequest, PrefillResult, RequestRejected
from engines.tokens import apply_bounds, check_beam
from engines.validate import Limits, RequestChecker


class ApiError(Exception):
    """An HTTP error answer: status and a message for the client (SGLang's error shape)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    def payload(self) -> dict[str, Any]:
        kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed", 413: "PayloadTooLarge",
                429: "TooManyRequests", 499: "ClientClosedRequest", 503: "ServiceUnavailable"}
        return {"object": "error", "message": self.message, "type": kind.get(self.status, "InternalServerError"),
                "param": None, "code": self.status}


class _Body(BaseModel):
    # strict: "5" is not an int and 1 is not a bool; a typo'd field is an error, not ignored
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ScoreBody(_Body):
    query: str | list[int] = ""
    items: str | list[str] | list[list[int]]
    label_token_ids: list[int] = Field(min_length=1)
    apply_softmax: bool = False
    item_first: bool = False
    model: str | None = None


class SamplingParams(_Body):
    max_new_tokens: int = 128  # SGLang's default
    min_new_tokens: int = 0
    temperature: float | None = None
    beam_width: int = Field(default=1, ge=1)
    n: int | None = Field(default=None, ge=1)


class GenerateBody(_Body):
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = SamplingParams()
    rid: str | None = None
    stream: bool = False
    return_logprob: bool = False
    model: str | None = None


def parse_body(model: type[_Body], raw: bytes) -> Any:
    """JSON bytes -> a validated body, or ApiError(400) naming every bad field."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise ApiError(400, validation_message(e)) from None


def validation_message(e: ValidationError) -> str:
    lines, seen = [], set()
    for err in e.errors():
        if err["type"] == "json_invalid":
            return f"body is not valid JSON: {err['ctx'].get('error', err['msg'])}"
        where = ".".join(str(p) for p in err["loc"]) or "(body)"
        line = f"field {where}: {err['msg']}"
        if err["type"] == "extra_forbidden":
            line = f"field {where}: unknown field"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    more = f" (and {len(lines) - 6} more)" if len(lines) > 6 else ""
    return "invalid request: " + "; ".join(lines[:6]) + more


@dataclass
class Translated:
    """An engine request plus what the answer needs from the body."""

    request: PrefillRequest | BeamRequest
    prompt_tokens: int
    n: int = 0  # beams to return
    beam: bool = False  # answer in the beam shape (W > 1)


class Translator:
    """Bodies -> engine requests within the scenario's bounds; results -> SGLang answers."""

    def __init__(self, tokenizer: Any, vocab_size: int, bounds: Bounds,
                 allowed: Sequence[Sequence[int]] | None = None, model_name: str = "default"):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.bounds = bounds
        self.allowed = allowed
        self.model_name = model_name
        self.checker = RequestChecker(Limits(bounds, vocab_size), tokenizer)

    def _ids(self, what: str, ids: Sequence[int]) -> list[int]:
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"{what}: token id {bad} outside 0..{self.vocab_size - 1}")
        return list(ids)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def score(self, body: ScoreBody, rid: str) -> Translated:
        if not body.apply_softmax:
            raise ApiError(400, "apply_softmax must be true: engines return label probabilities "
                                "normalised over the label tokens")
        items = [body.items] if isinstance(body.items, str) else body.items
        if not items:
            raise ApiError(400, "field items: need at least one item")
        text = isinstance(items[0], str)
        if text != isinstance(body.query, str):
            raise ApiError(400, "query and items must both be text or both be token id lists")
        labels = self._ids("label_token_ids", body.label_token_ids)
        if body.query and not body.item_first:
            return self._query_request(body, items, labels, rid)
        if text:
            seqs = [self._encode(i + body.query if body.item_first else body.query + i) for i in items]
        else:
            q = self._ids("query", body.query)
            seqs = [self._ids(f"items.{k}", i) + q if body.item_first else q + self._ids(f"items.{k}", i)
                    for k, i in enumerate(items)]
        try:
            seqs = apply_bounds(self.bounds, seqs, "item")
        except RequestRejected as e:
            raise ApiError(400, str(e)) from None
        return Translated(PrefillRequest(rid, seqs, labels), sum(map(len, seqs)))

    def _query_request(self, body: ScoreBody, items: list, labels: list[int], rid: str) -> Translated:
        """query + items as the engine's query request, as token ids, checked against
        max_query_tokens, max_item_tokens and max_samples_per_request (items)."""
        try:
            checked = self.checker.prefill(PrefillRequest.with_query(rid, body.query, items, labels))
        except RequestRejected as e:
            raise ApiError(400, str(e)) from None
        if checked.query_len == 0:  # text merged across every boundary: nothing to share
            return Translated(PrefillRequest(rid, checked.seqs, labels), sum(map(len, checked.seqs)))
        req = PrefillRequest.with_query(rid, checked.query, checked.items, labels)
        return Translated(req, sum(map(len, checked.seqs)))

    def generate(self, body: GenerateBody, rid: str) -> Translated:
        if (body.text is None) == (body.input_ids is None):
            raise ApiError(400, "give exactly one of text or input_ids")
        if body.stream:
            raise ApiError(400, "stream is not served: answers come whole")
        if body.return_logprob:
            raise ApiError(400, "return_logprob is not served: engines report each beam's cumulative "
                                "log-probability only (meta_info.sequence_score = cumulative / length)")
        sp = body.sampling_params
        if sp.temperature not in (None, 0.0):
            raise ApiError(400, f"temperature {sp.temperature:g} is not served: only deterministic "
                                "decoding (temperature 0, greedy or beam search)")
        if sp.min_new_tokens > sp.max_new_tokens:
            raise ApiError(400, f"min_new_tokens {sp.min_new_tokens} > max_new_tokens {sp.max_new_tokens}")
        n = sp.beam_width if sp.n is None else sp.n
        if n > sp.beam_width:
            raise ApiError(400, f"n {n} > beam_width {sp.beam_width}: at most beam_width beams come back")
        prompt = self._encode(body.text) if body.text is not None else self._ids("input_ids", body.input_ids)
        try:
            check_beam(self.bounds, sp.beam_width, sp.max_new_tokens)
            prompt = apply_bounds(self.bounds, [prompt], "prompt")[0]
        except RequestRejected as e:
            raise ApiError(400, str(e).replace("decode_steps", "max_new_tokens")) from None
        req = BeamRequest(body.rid or rid, prompt, sp.beam_width, sp.max_new_tokens, self.allowed)
        return Translated(req, len(prompt), n, sp.beam_width > 1)

    def score_answer(self, result: PrefillResult, t: Translated) -> dict[str, Any]:
        return {"scores": result.scores, "model": self.model_name, "object": "scoring",
                "usage": {"prompt_tokens": t.prompt_tokens, "completion_tokens": 0,
                          "total_tokens": t.prompt_tokens}}

    def generate_answer(self, result: BeamResult, t: Translated, latency_s: float) -> dict[str, Any]:
        beams = result.beams[: t.n]
        if not beams:
            raise ApiError(500, "engine returned no beams")
        per_beam = [{"output_ids": b.token_ids, "text": b.text,
                     "meta_info": {"finish_reason": {"type": "length", "length": len(b.token_ids)},
                                   "sequence_score": b.logprob / max(len(b.token_ids), 1)}} for b in beams]
        completion = sum(len(b.token_ids) for b in beams)
        meta = {"id": t.request.id, "prompt_tokens": t.prompt_tokens, "completion_tokens": completion,
                **per_beam[0]["meta_info"], "e2e_latency": latency_s}
        if t.beam:
            meta["beam_results"] = per_beam
        return {"text": beams[0].text, "output_ids": beams[0].token_ids, "meta_info": meta}
