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
from engines.validate import FieldNames, Limits, RequestChecker
from harness import strict_json
from harness.scenario.errors import field_errors


class ApiError(Exception):
    """An HTTP error answer: status and a message for the client (SGLang's error shape)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    def payload(self) -> dict[str, Any]:
        kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed", 408: "RequestTimeout",
                413: "PayloadTooLarge", 415: "UnsupportedMediaType", 429: "TooManyRequests",
                499: "ClientClosedRequest", 503: "ServiceUnavailable"}
        return {"object": "error", "message": self.message, "type": kind.get(self.status, "InternalServerError"),
                "param": None, "code": self.status}


class _Body(BaseModel):
    # strict: "5" is not an int and 1 is not a bool; a typo'd field is an error, not ignored
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ScoreBody(_Body):
    query: str | list[int] = ""
    items: str | list[str] | list[list[int]]
    label_token_ids: list[int]
    apply_softmax: bool = False
    item_first: bool = False
    model: str | None = None


class SamplingParams(_Body):
    max_new_tokens: int = Field(default=128, ge=1)  # SGLang's default
    min_new_tokens: int = Field(default=0, ge=0)
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


def _joined(query: str | list[int], items: list, item_first: bool) -> list:
    """Each sample of a score body without a query request: item + query or query + item
    (token lists concatenated, text joined before tokenizing)."""
    if not query:
        return list(items)
    if any(isinstance(item, str) != isinstance(query, str) for item in items):
        raise ApiError(400, "query and items must both be text or both be token id lists")
    if isinstance(query, str):
        return [item + query if item_first else query + item for item in items]
    return [list(item) + query if item_first else query + list(item) for item in items]


def _checked(check, request):
    try:
        return check(request)
    except RequestRejected as e:
        raise ApiError(400, str(e)) from None


def parse_body(model: type[_Body], raw: bytes) -> Any:
    """JSON bytes -> a validated body, or ApiError(400) naming every bad field. Parsed strictly
    (`harness.strict_json`: a key given twice is an error, not the last one winning)."""
    try:
        return model.model_validate(strict_json.loads(raw))
    except strict_json.BadJson as e:
        raise ApiError(400, f"body is {e}") from None
    except ValidationError as e:
        raise ApiError(400, validation_message(e)) from None


def validation_message(e: ValidationError) -> str:
    lines = [f"field {where}: {'unknown field' if msg == 'Extra inputs are not permitted' else msg}"
             for where, msg in field_errors(e, yaml_hints=False)]
    more = f" (and {len(lines) - 6} more)" if len(lines) > 6 else ""
    return "invalid request: " + "; ".join(lines[:6]) + more


@dataclass
class Translated:
    """An engine request plus what the answer needs from the body."""

    request: PrefillRequest | BeamRequest
    prompt_tokens: int
    n: int = 0  # beams to return
    beam: bool = False  # answer in the beam shape (W > 1)


SCORE_NAMES = FieldNames(samples="items", items="items", query="query", labels="label_token_ids")
BEAM_NAMES = dict(beam_width="sampling_params.beam_width", decode_steps="sampling_params.max_new_tokens",
                  allowed="the scenario's item codes")


class Translator:
    """Bodies -> engine requests within the scenario's bounds; results -> SGLang answers.
    Every request field is judged by the engines' shared check (`engines.validate`), with the
    body's field names; a refusal is a 400 naming the field."""

    def __init__(self, tokenizer: Any, vocab_size: int | None, bounds: Bounds,
                 allowed: Sequence[Sequence[int]] | None = None, model_name: str = "default",
                 max_positions: int | None = None, eos: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.bounds = bounds
        self.allowed = allowed
        self.model_name = model_name
        limits = Limits(bounds, vocab_size, max_positions, eos)
        self.checker = RequestChecker(limits, tokenizer, SCORE_NAMES)
        self._beam_checkers = {kind: RequestChecker(limits, tokenizer, FieldNames(prompt=kind, **BEAM_NAMES))
                               for kind in ("text", "input_ids")}

    def score(self, body: ScoreBody, rid: str) -> Translated:
        if not body.apply_softmax:
            raise ApiError(400, "apply_softmax must be true: engines return label probabilities "
                                "normalised over the label tokens")
        items = [body.items] if isinstance(body.items, str) else body.items
        labels = list(body.label_token_ids)
        if body.query and not body.item_first:  # a query request: the engine may share the query
            req = PrefillRequest.with_query(rid, body.query, items, labels)
        else:
            req = PrefillRequest(rid, _joined(body.query, items, body.item_first), labels)
        checked = _checked(self.checker.prefill, req)
        total = sum(map(len, checked.seqs))
        if checked.query_len:
            return Translated(PrefillRequest.with_query(rid, checked.query, checked.items, checked.labels), total)
        return Translated(PrefillRequest(rid, checked.seqs, checked.labels), total)

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
        text = body.text is not None
        req = BeamRequest(body.rid or rid, body.text if text else body.input_ids, sp.beam_width, sp.max_new_tokens,
                          self.allowed)
        checked = _checked(self._beam_checkers["text" if text else "input_ids"].beam, req)
        req = BeamRequest(req.id, checked.prompt, checked.beam_width, checked.decode_steps, self.allowed)
        return Translated(req, len(checked.prompt), n, sp.beam_width > 1)

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
