"""A whole scenario: its sections (harness.scenario.task, .load, .sweep), its engine entries,
and the checks that tie the sections together."""
from __future__ import annotations

from typing import Any, Literal
from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from engines.registry import ENGINES
from harness.scenario.fields import DEVICE, Strict, longest
from harness.scenario.load import CpuLimits, Load, Slo
from harness.scenario.sweep import Sweep, check_sweep_values
from harness.scenario.task import BeamTaskSpec, BoundsSpec, PrefillTaskSpec, TaskSpec, Workload


class EngineSpec(Strict):
    """An engine entry: its name, an optional `label` (how tables and reports call it, so one
    engine may be listed twice with different options), an optional `dtype` for this engine
    alone (e.g. a float32 transformers reference beside bf16 engines), and engine-specific
    options (checked against the engine's own schema by harness.run.preflight)."""

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


class Scenario(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # names the run folder: no "/" or ".."
    description: str = ""
    model: str = Field(min_length=1)
    dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"
    device: str = Field(default="cpu", pattern=DEVICE.pattern)
    task: TaskSpec
    workload: Workload
    bounds: BoundsSpec = BoundsSpec()
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
            if spec.unconstrained and not isinstance(self.task, BeamTaskSpec):
                raise ValueError(f"engines.{k}.unconstrained: only for beam search (a {self.task.kind} task has no "
                                 "item codes to leave out)")
        return self

    @model_validator(mode="after")
    def _query_needs_prefill(self) -> "Scenario":
        if self.workload.has_query and not isinstance(self.task, PrefillTaskSpec):
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
        if isinstance(task, BeamTaskSpec) and wl.samples_per_request != 1:
            raise ValueError("workload.samples_per_request: a beam_search request has one prompt; leave it at 1")
        if b.on_violation != "reject":
            return self
        checks = [("samples_per_request", wl.samples_per_request, "max_samples_per_request", b.max_samples_per_request),
                  ("prompt_tokens", longest(wl.prompt_tokens), "max_prompt_tokens", b.max_prompt_tokens),
                  ("items_per_request", longest(wl.items_per_request), "max_samples_per_request",
                   b.max_samples_per_request),
                  ("query_tokens", longest(wl.query_tokens), "max_query_tokens", b.max_query_tokens or b.max_prompt_tokens),
                  ("item_tokens", longest(wl.item_tokens), "max_item_tokens", b.max_item_tokens or b.max_prompt_tokens)]
        for field, most, bound, cap in checks:
            if most is not None and most > cap:
                what = f"up to {most} tokens" if field.endswith("_tokens") else str(most)
                raise ValueError(f"workload.{field}: {what} > bounds.{bound} {cap}: those requests would be rejected")
        if wl.has_query and longest(wl.query_tokens) + longest(wl.item_tokens) > b.max_prompt_tokens:
            raise ValueError(f"workload.item_tokens: a query of up to {longest(wl.query_tokens)} tokens and an item "
                             f"of up to {longest(wl.item_tokens)} > bounds.max_prompt_tokens {b.max_prompt_tokens} "
                             "(each concatenation is a sample): those requests would be rejected")
        return self
