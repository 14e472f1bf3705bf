"""Scenario files: YAML validated by pydantic. A bad file raises `ScenarioError` whose message
names the file and the field."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrefillTask(_Strict):
    kind: Literal["prefill_only"]
    labels: list[Union[str, int]] = Field(min_length=2)


class ItemCodes(_Strict):
    """Allowed item codes for constrained beam search: random codes drawn from the seed."""

    count: int = Field(gt=0)
    length: int = Field(gt=0, le=8)
    seed: int = 1


class BeamTask(_Strict):
    kind: Literal["beam_search"]
    beam_width: int = Field(gt=0, le=4096)
    decode_steps: int = Field(gt=0, le=64)
    item_codes: ItemCodes | None = None


Task = Annotated[Union[PrefillTask, BeamTask], Field(discriminator="kind")]


class TokenDist(_Strict):
    """Token-length distribution: normal around `mean`, clipped to [min, max]; `std`
    defaults to a quarter of the range."""

    mean: float = Field(gt=0)
    min: int = Field(ge=1)
    max: int = Field(ge=1)
    std: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> "TokenDist":
        if not self.min <= self.mean <= self.max:
            raise ValueError(f"need min <= mean <= max, got min={self.min} mean={self.mean} max={self.max}")
        return self


class Workload(_Strict):
    """Synthetic samples (`samples_per_request` x `prompt_tokens`), synthetic query + items
    requests (`query_tokens`, `item_tokens`, `items_per_request`: sample i is the query
    followed by item i), or a JSONL dataset."""

    samples_per_request: int = Field(default=1, gt=0)
    prompt_tokens: TokenDist | int | None = None
    query_tokens: TokenDist | int | None = None
    item_tokens: TokenDist | int | None = None
    items_per_request: TokenDist | int | None = None  # a number, or a distribution like the lengths
    dataset: str | None = None  # JSONL of requests (see `bench infer` input format)
    seed: int = 0

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


class Bounds(_Strict):
    max_samples_per_request: int = Field(default=16, gt=0)  # samples, or items of a query request
    max_prompt_tokens: int = Field(default=512, gt=0)
    max_query_tokens: int | None = Field(default=None, gt=0)  # default: max_prompt_tokens
    max_item_tokens: int | None = Field(default=None, gt=0)  # default: max_prompt_tokens
    on_violation: Literal["reject", "truncate"] = "reject"


class ClosedLoad(_Strict):
    mode: Literal["closed"]
    concurrency: list[int] = Field(min_length=1)
    requests: int = Field(default=100, gt=0)
    warmup_requests: int = Field(default=5, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(c <= 0 for c in v):
            raise ValueError("every concurrency must be > 0")
        return v


class PoissonLoad(_Strict):
    mode: Literal["poisson"]
    rate: list[float] = Field(min_length=1)
    duration_s: float | None = Field(default=None, gt=0)
    requests: int | None = Field(default=None, gt=0)
    warmup_s: float = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("rate")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(r <= 0 for r in v):
            raise ValueError("every rate must be > 0")
        return v

    @model_validator(mode="after")
    def _limit(self) -> "PoissonLoad":
        if self.duration_s is None and self.requests is None:
            raise ValueError("give duration_s or requests")
        return self


Load = Annotated[Union[ClosedLoad, PoissonLoad], Field(discriminator="mode")]


class CpuLimits(_Strict):
    """Smaller counts used when the run is on a CPU and the command line sets none."""

    requests: int | None = Field(default=None, gt=0)
    warmup_requests: int | None = Field(default=None, ge=0)
    duration_s: float | None = Field(default=None, gt=0)
    concurrency: list[int] | None = None
    rate: list[float] | None = None


class Slo(_Strict):
    mean_ms: float | None = Field(default=None, gt=0)
    p99_ms: float | None = Field(default=None, gt=0)


class EngineSpec(_Strict):
    """An engine entry: its name, an optional `label` (how tables and reports call it, so one
    engine may be listed twice with different options), and engine-specific options."""

    model_config = ConfigDict(extra="allow", frozen=True)  # engine-specific options
    name: str
    label: str | None = Field(default=None, min_length=1)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @property
    def title(self) -> str:
        return self.label or self.name


class Scenario(_Strict):
    name: str
    description: str = ""
    model: str
    dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"
    device: str = "cpu"
    task: Task
    workload: Workload
    bounds: Bounds = Bounds()
    load: Load
    cpu: CpuLimits | None = None
    slo: Slo = Slo()
    engines: list[EngineSpec] = Field(min_length=1)

    @field_validator("engines", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"name": e} if isinstance(e, str) else e for e in v]
        return v

    @model_validator(mode="after")
    def _query_needs_prefill(self) -> "Scenario":
        if self.workload.has_query and not isinstance(self.task, PrefillTask):
            raise ValueError("a query + items workload needs task kind prefill_only")
        titles = [e.title for e in self.engines]
        dup = next((t for t in titles if titles.count(t) > 1), None)
        if dup is not None:
            raise ValueError(f"engine {dup!r} is listed twice; give each entry of the same engine "
                             "its own label (e.g. {name: bounded, label: bounded-noshare, ...})")
        return self


class ScenarioError(ValueError):
    """A scenario file is unreadable or invalid; the message names the file and the field."""


def _where(loc: tuple[Any, ...]) -> str:
    # drop pydantic's union-branch tags (e.g. 'closed', 'function-after[...]') from the path
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in {"closed", "poisson", "prefill_only", "beam_search", "int", "TokenDist"}))]
    return ".".join(parts) or "(top level)"


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: the file must hold a mapping of fields, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        lines = [f"{source}: invalid scenario"]
        for err in e.errors():
            lines.append(f"  field {_where(err['loc'])}: {err['msg']}")
        raise ScenarioError("\n".join(lines)) from None


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read scenario file ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}") from None
    return parse_scenario(data, str(path))
