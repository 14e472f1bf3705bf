"""The load, cpu and slo sections of a scenario: how hard requests are sent."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union
from pydantic import Field, field_validator, model_validator

from harness.scenario.fields import Count, MAX_CONCURRENCY, MAX_RATE, MAX_REQUESTS, MAX_SECONDS, Seconds, Strict, _levels


class ClosedLoad(Strict):
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


class PoissonLoad(Strict):
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


class CpuLimits(Strict):
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


class Slo(Strict):
    mean_ms: float | None = Field(default=None, gt=0)
    p99_ms: float | None = Field(default=None, gt=0)
