"""The task, workload and bounds sections of a scenario: what a request is and asks for."""
from __future__ import annotations

from typing import Annotated, Literal, Union
from pydantic import Field, field_validator, model_validator

from engines.validate import MAX_BEAM_WIDTH, MAX_DECODE_STEPS, MAX_SAMPLES
from harness.scenario.fields import Length, MAX_ITEM_CODES, MAX_PROMPT_TOKENS, MAX_REQUEST_TOKENS, TokenDist, Strict


class PrefillTaskSpec(Strict):
    kind: Literal["prefill_only"]
    labels: list[Union[str, int]] = Field(min_length=2, max_length=4096)

    @field_validator("labels")
    @classmethod
    def _distinct(cls, v: list) -> list:
        seen = set()
        for k, lab in enumerate(v):
            if (type(lab), lab) in seen:
                raise ValueError(f"label {k} ({lab!r}) is listed twice; labels must be distinct")
            seen.add((type(lab), lab))
        return v


class ItemCodes(Strict):
    """Allowed item codes for constrained beam search: random codes drawn from the seed."""

    count: int = Field(gt=0, le=MAX_ITEM_CODES)
    length: int = Field(gt=0, le=MAX_DECODE_STEPS)
    seed: int = Field(default=1, ge=0)


class BeamTaskSpec(Strict):
    kind: Literal["beam_search"]
    beam_width: int = Field(gt=0, le=MAX_BEAM_WIDTH)
    decode_steps: int = Field(gt=0, le=MAX_DECODE_STEPS)
    item_codes: ItemCodes | None = None

    @model_validator(mode="after")
    def _codes_fit(self) -> "BeamTaskSpec":
        c = self.item_codes
        if c is not None and c.length != self.decode_steps:
            raise ValueError(f"item_codes.length: {c.length} must equal decode_steps {self.decode_steps} "
                             "(every beam generates exactly decode_steps tokens)")
        if c is not None and c.count < self.beam_width:
            raise ValueError(f"item_codes.count: {c.count} < beam_width {self.beam_width}: only that many "
                             "complete beams exist")
        return self


TaskSpec = Annotated[Union[PrefillTaskSpec, BeamTaskSpec], Field(discriminator="kind")]


class Workload(Strict):
    """Synthetic samples (`samples_per_request` x `prompt_tokens`), synthetic query + items
    requests (`query_tokens`, `item_tokens`, `items_per_request`: sample i is the query
    followed by item i), or a JSONL dataset."""

    samples_per_request: int = Field(default=1, gt=0, le=MAX_SAMPLES)
    prompt_tokens: TokenDist | Length | None = None
    query_tokens: TokenDist | Length | None = None
    item_tokens: TokenDist | Length | None = None
    items_per_request: TokenDist | Annotated[int, Field(ge=1, le=MAX_SAMPLES)] | None = None  # or a distribution
    dataset: str | None = Field(default=None, min_length=1)  # JSONL of requests (`bench infer` format)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _source(self) -> "Workload":
        query = {"query_tokens", "item_tokens", "items_per_request"} & self.model_fields_set
        sources = [self.prompt_tokens is not None, bool(query), self.dataset is not None]
        if sum(sources) != 1:
            raise ValueError("give exactly one of prompt_tokens (synthetic samples), query_tokens + "
                             "item_tokens + items_per_request (synthetic query + items) or dataset (JSONL file)")
        if query:
            missing = sorted({"query_tokens", "item_tokens", "items_per_request"} - query)
            if missing:
                raise ValueError(f"a query + items workload needs {', '.join(missing)} too")
            if "samples_per_request" in self.model_fields_set:
                raise ValueError("samples_per_request is for samples; a query + items workload gives "
                                 "items_per_request")
        return self

    @property
    def has_query(self) -> bool:
        return self.query_tokens is not None


class BoundsSpec(Strict):
    max_samples_per_request: int = Field(default=16, gt=0, le=MAX_SAMPLES)  # samples, or items of a query request
    max_prompt_tokens: int = Field(default=512, gt=0, le=MAX_PROMPT_TOKENS)
    # a query request: its query, each item (default: max_prompt_tokens); each query + item
    # is a sample and fits max_prompt_tokens too
    max_query_tokens: int | None = Field(default=None, gt=0, le=MAX_PROMPT_TOKENS)
    max_item_tokens: int | None = Field(default=None, gt=0, le=MAX_PROMPT_TOKENS)
    # beam bounds: None sizes them from the task (each sweep cell's, see harness/sweep.py)
    max_beam_width: int | None = Field(default=None, gt=0, le=MAX_BEAM_WIDTH)
    max_decode_steps: int | None = Field(default=None, gt=0, le=MAX_DECODE_STEPS)
    on_violation: Literal["reject", "truncate"] = "reject"

    @model_validator(mode="after")
    def _planned(self) -> "BoundsSpec":
        if self.max_samples_per_request * self.max_prompt_tokens > MAX_REQUEST_TOKENS:
            raise ValueError(f"max_prompt_tokens: max_samples_per_request x max_prompt_tokens = "
                             f"{self.max_samples_per_request * self.max_prompt_tokens:,} tokens per request "
                             f"> {MAX_REQUEST_TOKENS:,}: engines plan buffers for it at start")
        return self
