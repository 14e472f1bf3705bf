"""Scenario files: YAML validated by pydantic. A bad file raises `ScenarioError` whose message
names the file and the field.

The file is checked on its own here: UTF-8 text, YAML without aliases or repeated keys,
strict types (`true` is not a count, `4.5` is not an integer), counts and sizes capped so a
typo cannot ask for 10**21 requests, known engine names, no engine listed twice. What needs
the model, the tokenizer, datasets or the engines' own option schemas is checked by
`harness.preflight` before any engine starts.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from engines.registry import ENGINES
from engines.validate import MAX_BEAM_WIDTH, MAX_DECODE_STEPS, MAX_SAMPLES

# Caps on what one scenario may ask for (far above any bounded workload; below what would
# hang while requests are made up front, or exhaust memory while buffers are planned).
MAX_REQUESTS = 1_000_000  # per load point, warm-up included
MAX_CONCURRENCY = 10_000
MAX_RATE = 1_000_000.0
MAX_SECONDS = 7 * 24 * 3600.0
MAX_PROMPT_TOKENS = 1 << 20
MAX_REQUEST_TOKENS = 1 << 22  # max_samples_per_request x max_prompt_tokens
MAX_ITEM_CODES = 10_000_000
MAX_RUN_TOKENS = 200_000_000  # synthetic text a run makes up front (all its load points)
MAX_FILE_BYTES = 1 << 20
DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class PrefillTask(_Strict):
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


class ItemCodes(_Strict):
    """Allowed item codes for constrained beam search: random codes drawn from the seed."""

    count: int = Field(gt=0, le=MAX_ITEM_CODES)
    length: int = Field(gt=0, le=MAX_DECODE_STEPS)
    seed: int = Field(default=1, ge=0)


class BeamTask(_Strict):
    kind: Literal["beam_search"]
    beam_width: int = Field(gt=0, le=MAX_BEAM_WIDTH)
    decode_steps: int = Field(gt=0, le=MAX_DECODE_STEPS)
    item_codes: ItemCodes | None = None

    @model_validator(mode="after")
    def _codes_fit(self) -> "BeamTask":
        c = self.item_codes
        if c is not None and c.length != self.decode_steps:
            raise ValueError(f"item_codes.length: {c.length} must equal decode_steps {self.decode_steps} "
                             "(every beam generates exactly decode_steps tokens)")
        if c is not None and c.count < self.beam_width:
            raise ValueError(f"item_codes.count: {c.count} < beam_width {self.beam_width}: only that many "
                             "complete beams exist")
        return self


Task = Annotated[Union[PrefillTask, BeamTask], Field(discriminator="kind")]


class TokenDist(_Strict):
    """Token-length distribution: normal around `mean`, clipped to [min, max]; `std`
    defaults to a quarter of the range."""

    mean: float = Field(gt=0)
    min: int = Field(ge=1, le=MAX_PROMPT_TOKENS)
    max: int = Field(ge=1, le=MAX_PROMPT_TOKENS)
    std: float | None = Field(default=None, ge=0, le=MAX_PROMPT_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> "TokenDist":
        if not self.min <= self.mean <= self.max:
            raise ValueError(f"need min <= mean <= max, got min={self.min} mean={self.mean} max={self.max}")
        return self


Length = Annotated[int, Field(ge=1, le=MAX_PROMPT_TOKENS)]


class Workload(_Strict):
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


class Bounds(_Strict):
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
    def _planned(self) -> "Bounds":
        if self.max_samples_per_request * self.max_prompt_tokens > MAX_REQUEST_TOKENS:
            raise ValueError(f"max_prompt_tokens: max_samples_per_request x max_prompt_tokens = "
                             f"{self.max_samples_per_request * self.max_prompt_tokens:,} tokens per request "
                             f"> {MAX_REQUEST_TOKENS:,}: engines plan buffers for it at start")
        return self


Count = Annotated[int, Field(gt=0, le=MAX_REQUESTS)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


def _levels(v: list, what: str, cap: float) -> list:
    if any(x <= 0 for x in v):
        raise ValueError(f"every {what} must be > 0")
    if any(x > cap for x in v):
        raise ValueError(f"every {what} must be <= {cap:g}")
    if len(set(v)) != len(v):
        raise ValueError(f"a {what} is listed twice")
    return v


class ClosedLoad(_Strict):
    mode: Literal["closed"]
    concurrency: list[int] = Field(min_length=1, max_length=1000)
    requests: Count = 100
    warmup_requests: int = Field(default=5, ge=0, le=MAX_REQUESTS)
    timeout_s: Seconds = 60.0

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        return _levels(v, "concurrency", MAX_CONCURRENCY)

    @model_validator(mode="after")
    def _size(self) -> "ClosedLoad":
        if self.requests + self.warmup_requests > MAX_REQUESTS:
            raise ValueError(f"requests: requests + warmup_requests > {MAX_REQUESTS:,} per load point")
        return self


class PoissonLoad(_Strict):
    mode: Literal["poisson"]
    rate: list[float] = Field(min_length=1, max_length=1000)
    duration_s: Seconds | None = None
    requests: Count | None = None
    warmup_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)
    timeout_s: Seconds = 60.0

    @field_validator("rate")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        return _levels(v, "rate", MAX_RATE)

    @model_validator(mode="after")
    def _limit(self) -> "PoissonLoad":
        if self.duration_s is None and self.requests is None:
            raise ValueError("duration_s: give duration_s or requests")
        # arrivals are drawn, and their requests made, before a point starts
        horizon = self.warmup_s + (self.duration_s or 0.0)
        most = max(self.rate) * horizon if self.duration_s is not None else (
            max(self.rate) * self.warmup_s * 1.5 + (self.requests or 0))
        if most > MAX_REQUESTS:
            raise ValueError(f"rate: the fastest rate over warmup_s + duration_s sends ~{most:,.0f} requests "
                             f"> {MAX_REQUESTS:,} per load point")
        slowest = min(self.rate)
        if self.duration_s is not None and slowest * self.duration_s < 1:
            raise ValueError(f"rate: {slowest:g}/s over duration_s {self.duration_s:g} expects no request at all")
        if self.duration_s is None and (self.requests or 0) / slowest > MAX_SECONDS:
            raise ValueError(f"rate: {self.requests} requests at {slowest:g}/s take ~{self.requests / slowest:,.0f} s "
                             f"> {MAX_SECONDS:,.0f}")
        return self


Load = Annotated[Union[ClosedLoad, PoissonLoad], Field(discriminator="mode")]


class CpuLimits(_Strict):
    """Smaller counts used when the run is on a CPU and the command line sets none (checked
    again with the load they change)."""

    requests: Count | None = None
    warmup_requests: int | None = Field(default=None, ge=0, le=MAX_REQUESTS)
    duration_s: Seconds | None = None
    concurrency: list[int] | None = Field(default=None, min_length=1, max_length=1000)
    rate: list[float] | None = Field(default=None, min_length=1, max_length=1000)
    sweep: dict[str, list[Any]] | None = None  # values of swept parameters, replacing the sweep's

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, v: list[int] | None) -> list[int] | None:
        return v if v is None else _levels(v, "concurrency", MAX_CONCURRENCY)

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: list[float] | None) -> list[float] | None:
        return v if v is None else _levels(v, "rate", MAX_RATE)


# Parameters a sweep may vary, and the scenario section each belongs to.
SWEEP_PARAMS = {"beam_width": "task", "decode_steps": "task", "samples_per_request": "workload",
                "prompt_tokens": "workload", "items_per_request": "workload", "query_tokens": "workload",
                "item_tokens": "workload"}
SIZINGS = ("cell", "largest")


class Sweep(_Strict):
    """`sweep:` -- task and workload parameters, each a list of values; their cross product
    are the cells, each run at every load point. `sizing`: engines sized for each cell (cell,
    the default: restarted when a cell needs other bounds) or once for the largest cell."""

    model_config = ConfigDict(extra="allow", frozen=True)  # the parameters
    sizing: Literal["cell", "largest"] = "cell"

    @property
    def params(self) -> dict[str, list[Any]]:
        return dict(self.model_extra or {})


def check_sweep_values(params: dict[str, Any], task: Any, workload: Any) -> None:
    """Every value of every swept parameter must make a valid task / workload."""
    if not params:
        raise ValueError(f"name at least one parameter to sweep; parameters: {', '.join(SWEEP_PARAMS)}")
    for name, values in params.items():
        if name not in SWEEP_PARAMS:
            raise ValueError(f"unknown sweep parameter {name!r}; parameters: {', '.join(SWEEP_PARAMS)}")
        section = {"task": task, "workload": workload}[SWEEP_PARAMS[name]]
        if section is None:
            return  # that section is invalid itself: its own error says why
        if name not in type(section).model_fields:
            raise ValueError(f"{name}: a {getattr(section, 'kind', 'synthetic')} task has no {name}")
        if name == "samples_per_request" and getattr(task, "kind", "") == "beam_search":
            raise ValueError(f"{name}: a beam_search request has one prompt; sweep beam_width or decode_steps")
        if getattr(workload, "dataset", None) is not None and name in ("beam_width", "decode_steps"):
            raise ValueError(f"{name}: the dataset's requests carry their own {name}; a sweep cannot change it")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{name}: give a non-empty list of values, e.g. {name}: [1, 2, 4]")
        if len({repr(v) for v in values}) < len(values):
            raise ValueError(f"{name}: a value is given twice")
        for i, v in enumerate(values):
            if isinstance(v, bool):
                raise ValueError(f"{name}[{i}] = {v!r}: a number is expected, not a boolean")
            try:
                type(section).model_validate({**section.model_dump(exclude_unset=True), name: v})
            except ValidationError as e:
                raise ValueError(f"{name}[{i}] = {v!r}: {e.errors()[0]['msg']}") from None


class Slo(_Strict):
    mean_ms: float | None = Field(default=None, gt=0)
    p99_ms: float | None = Field(default=None, gt=0)


class EngineSpec(_Strict):
    """An engine entry: its name, an optional `label` (how tables and reports call it, so one
    engine may be listed twice with different options), an optional `dtype` for this engine
    alone (e.g. a float32 transformers reference beside bf16 engines), and engine-specific
    options (checked against the engine's own schema by harness.preflight)."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    name: str
    label: str | None = Field(default=None, min_length=1)
    # beam search with item codes: send this engine the requests without their codes (for
    # engines that cannot constrain beams) and report the share of its beams that are codes
    unconstrained: bool = False
    dtype: Literal["bfloat16", "float32", "float16"] | None = None
    # may be missing here: skipped (its reason printed and recorded) without failing the run,
    # unless the command line names it (`--engine NAME`)
    optional: bool = False

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in ENGINES:
            raise ValueError(f"unknown engine {v!r}; known engines: {', '.join(sorted(ENGINES))}")
        return v

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @property
    def title(self) -> str:
        return self.label or self.name


def _longest(dist: "TokenDist | int | None") -> int | None:
    return dist if isinstance(dist, int) or dist is None else dist.max


class Scenario(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # names the run folder: no "/" or ".."
    description: str = ""
    model: str = Field(min_length=1)
    dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"
    device: str = Field(default="cpu", pattern=DEVICE.pattern)
    task: Task
    workload: Workload
    bounds: Bounds = Bounds()
    load: Load
    cpu: CpuLimits | None = None
    slo: Slo = Slo()
    engines: list[EngineSpec] = Field(min_length=1)
    sweep: Sweep | None = None

    @field_validator("sweep")
    @classmethod
    def _sweep_values(cls, v: Sweep | None, info: ValidationInfo) -> Sweep | None:
        if v is not None:
            check_sweep_values(v.params, info.data.get("task"), info.data.get("workload"))
        return v

    @model_validator(mode="after")
    def _cpu_sweep(self) -> "Scenario":
        cpu = (self.cpu.sweep if self.cpu else None) or {}
        if cpu:
            swept = self.sweep.params if self.sweep else {}
            extra = [k for k in cpu if k not in swept]
            if extra:
                raise ValueError(f"cpu.sweep: {', '.join(extra)} not swept by the scenario's sweep "
                                 f"({', '.join(swept) or 'none'})")
            try:
                check_sweep_values(cpu, self.task, self.workload)
            except ValueError as e:
                raise ValueError(f"cpu.sweep: {e}") from None
        return self

    @field_validator("engines", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"name": e} if isinstance(e, str) else e for e in v]
        return v

    @model_validator(mode="after")
    def _unconstrained_needs_beams(self) -> "Scenario":
        for k, spec in enumerate(self.engines):
            if spec.unconstrained and not isinstance(self.task, BeamTask):
                raise ValueError(f"engines.{k}.unconstrained: only for beam search (a {self.task.kind} task has no "
                                 "item codes to leave out)")
        return self

    @model_validator(mode="after")
    def _query_needs_prefill(self) -> "Scenario":
        if self.workload.has_query and not isinstance(self.task, PrefillTask):
            raise ValueError("workload: a query + items workload needs task kind prefill_only")
        return self

    @field_validator("engines")
    @classmethod
    def _once_each(cls, v: list[EngineSpec]) -> list[EngineSpec]:
        seen: dict[str, int] = {}
        for k, spec in enumerate(v):
            if spec.title in seen:
                raise ValueError(f"{k}: engine {spec.title!r} is listed twice (entries {seen[spec.title]} and {k}); "
                                 "give each entry of the same engine its own label (e.g. {name: bounded, "
                                 "label: bounded-noshare, ...})")
            seen[spec.title] = k
        return v

    @model_validator(mode="after")
    def _cpu_fits_load(self) -> "Scenario":
        if self.cpu is None:
            return self
        fields = type(self.load).model_fields
        stray = [k for k, v in self.cpu.model_dump().items() if v is not None and k not in fields and k != "sweep"]
        if stray:
            raise ValueError(f"cpu.{stray[0]}: a {self.load.mode} load has no {stray[0]} "
                             f"(its fields: {', '.join(k for k in fields if k != 'mode')})")
        return self

    @model_validator(mode="after")
    def _workload_fits(self) -> "Scenario":
        wl, b, task = self.workload, self.bounds, self.task
        if isinstance(task, BeamTask) and wl.samples_per_request != 1:
            raise ValueError("workload.samples_per_request: a beam_search request has one prompt; leave it at 1")
        if b.on_violation != "reject":
            return self
        checks = [("samples_per_request", wl.samples_per_request, "max_samples_per_request", b.max_samples_per_request),
                  ("prompt_tokens", _longest(wl.prompt_tokens), "max_prompt_tokens", b.max_prompt_tokens),
                  ("items_per_request", _longest(wl.items_per_request), "max_samples_per_request",
                   b.max_samples_per_request),
                  ("query_tokens", _longest(wl.query_tokens), "max_query_tokens", b.max_query_tokens or b.max_prompt_tokens),
                  ("item_tokens", _longest(wl.item_tokens), "max_item_tokens", b.max_item_tokens or b.max_prompt_tokens)]
        for field, most, bound, cap in checks:
            if most is not None and most > cap:
                what = f"up to {most} tokens" if field.endswith("_tokens") else str(most)
                raise ValueError(f"workload.{field}: {what} > bounds.{bound} {cap}: those requests would be rejected")
        if wl.has_query and _longest(wl.query_tokens) + _longest(wl.item_tokens) > b.max_prompt_tokens:
            raise ValueError(f"workload.item_tokens: a query of up to {_longest(wl.query_tokens)} tokens and an item "
                             f"of up to {_longest(wl.item_tokens)} > bounds.max_prompt_tokens {b.max_prompt_tokens} "
                             "(each concatenation is a sample): those requests would be rejected")
        return self


class ScenarioError(ValueError):
    """A scenario file is unreadable or invalid; the message names the file and the field."""


_TAGS = {"closed", "poisson", "prefill_only", "beam_search", "int", "float", "str", "list[int]", "TokenDist",
         "constrained-int", "constrained-float"}
_NUMBER_TEXT = re.compile(r"^[-+]?\d+[eE][-+]?\d+$")  # 1e-9: a float in JSON, text in YAML 1.1
_FIELD_FIRST = re.compile(r"^(?:Value error, )?([a-z_0-9][\w.]*): (.*)$", re.S)


def _where(loc: tuple[Any, ...]) -> str:
    # drop pydantic's union-branch tags (e.g. 'closed', 'function-after[...]') from the path
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _TAGS))]
    return ".".join(parts) or "(top level)"


def field_errors(e: ValidationError, yaml_hints: bool = True) -> list[tuple[str, str]]:
    """(field path, message) per error; a validator's "x.y: message" extends the path; a
    union's branches that all refuse a value's type are one message. `yaml_hints`: say how
    YAML misread a value (not for JSON, where `true` and `1e-9` mean what they say)."""
    out: dict[str, list[tuple[bool, str]]] = {}
    hints: dict[str, str] = {}
    for err in e.errors():
        where, msg, is_type = _where(err["loc"]), err["msg"], err["type"].endswith("_type")
        m = _FIELD_FIRST.match(msg) if err["type"] == "value_error" else None
        if m:
            where = m.group(1) if where == "(top level)" else f"{where}.{m.group(1)}"
            msg = m.group(2)
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        misread = yaml_hints and is_type
        if misread and isinstance(err.get("input"), bool):
            hints[where] = " (YAML reads unquoted true/false/yes/no/on/off as booleans: quote it)"
        elif misread and isinstance(err.get("input"), str) and _NUMBER_TEXT.match(err["input"]):
            hints[where] = (f" (YAML reads {err['input']} as text: write the digits out, e.g. 1000000)"
                            if err["type"].startswith("int") else
                            f" (YAML reads {err['input']} as text: write it with a dot, e.g. 1.0e-9)")
        msgs = out.setdefault(where, [])
        if (is_type, msg) not in msgs:
            msgs.append((is_type, msg))
    # where another branch of a union got further into the value, its errors tell more
    deeper = {w for w, msgs in out.items() if all(t for t, _ in msgs) and any(x.startswith(w + ".") for x in out)}
    return [(w, _one_message(msgs) + hints.get(w, "")) for w, msgs in out.items() if w not in deeper]


def _one_message(msgs: list[tuple[bool, str]]) -> str:
    """The errors of a union's branches at one place: the branch that took the value's type
    tells why; if none did, say which types would do."""
    told = [m for is_type, m in msgs if not is_type]
    if told:
        return "; ".join(told)
    types = [m for _, m in msgs]
    return " or ".join([types[0]] + [m.removeprefix("Input should be ") for m in types[1:]])


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: the file must hold a mapping of fields, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        lines = [f"{source}: invalid scenario"] + [f"  field {w}: {m}" for w, m in field_errors(e)[:20]]
        raise ScenarioError("\n".join(lines)) from None


def revalidated(model: BaseModel, updates: dict[str, Any], names: dict[str, str], source: str,
                prefix: str = "") -> Any:
    """`model` with `updates`, checked again as the file was (`model_copy` would skip the
    checks); an error names the field as `names` calls it (e.g. "--requests")."""
    try:
        return type(model).model_validate({**model.model_dump(), **updates})
    except ValidationError as e:
        lines = [f"{source}: invalid settings"]
        for where, msg in field_errors(e):
            top = where.split(".")[0]
            lines.append(f"  {names.get(top, 'field ' + prefix + where)}: {msg}")
        raise ScenarioError("\n".join(lines)) from None


def select_engines(scenario: Scenario, names: list[str] | None) -> list[EngineSpec]:
    """The engines a run drives: the scenario's, or those the command line names (`--engine
    X` takes every entry whose name or label is X, with its options, else a plain X)."""
    if not names:
        return list(scenario.engines)
    specs: list[EngineSpec] = []
    for k, n in enumerate(names):
        if n in names[:k]:
            raise ScenarioError(f"--engine {n}: given twice")
        found = [s for s in scenario.engines if n in (s.name, s.label)]
        if not found and n not in ENGINES:
            entries = ", ".join(s.title for s in scenario.engines)
            raise ScenarioError(f"--engine {n}: unknown engine; known engines: {', '.join(sorted(ENGINES))}; "
                                f"this scenario's entries: {entries}")
        specs += [s for s in found or [EngineSpec(name=n)] if s not in specs]
    return specs


class _Loader(yaml.SafeLoader):
    """Safe YAML without aliases (an alias bomb expands to gigabytes) or repeated keys (the
    last one would silently win)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in scenario files",
                                              event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice",
                                                        key_node.start_mark)
            seen.add(key) if isinstance(key, (str, int, float, bool)) else None
        return super().construct_mapping(node, deep)


def read_text(path: Path, what: str = "scenario file", limit: int = MAX_FILE_BYTES) -> str:
    """A file's text: UTF-8 (a BOM is allowed), at most `limit` bytes; ScenarioError else."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read {what} ({e.strerror})") from None
    if len(raw) > limit:
        raise ScenarioError(f"{path}: {what} is over {limit:,} bytes")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: {what} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                            "save it as UTF-8") from None


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    if path.is_dir():
        raise ScenarioError(f"{path}: is a folder, not a scenario file")
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        raise ScenarioError(f"{path}: the file is empty (or only comments); a scenario is a mapping of fields, "
                            f"see scenarios/reference.yaml, which has every field")
    return parse_scenario(data, str(path))
