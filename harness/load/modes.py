"""Load modes by name (`load.mode` in a scenario): what each mode's load points are, how the
command line overrides them, how one point is driven, and how an SLO probe is sized from it.
The runner and the SLO search ask the registry instead of testing the load's type, so a new
mode is one class and one `LOAD_MODES` entry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from harness.measure.records import LoadPoint
from harness.load.loadgen import Tick, poisson_schedule, run_closed, run_poisson
from harness.scenario.errors import ScenarioError
from harness.scenario.load import ClosedLoad, PoissonLoad


@dataclass(frozen=True)
class ProbeLoad:
    """How each SLO probe is driven: the scenario's size, as a Poisson point."""

    seed: int
    requests: int | None = None
    duration_s: float | None = None
    warmup_s: float = 0.0
    warmup_requests: int = 0  # closed-loop scenarios: turned into seconds at each rate
    timeout_s: float = 60.0

    def schedule(self, rate: float):
        warmup_s = self.warmup_s or self.warmup_requests / rate
        return poisson_schedule(rate, self.seed, duration_s=self.duration_s, requests=self.requests,
                                warmup_s=warmup_s), warmup_s


@dataclass(frozen=True)
class LoadOverrides:
    """The command line's say on the load (None / empty: keep the scenario's)."""

    requests: int | None = None
    duration_s: float | None = None
    concurrency: Sequence[int] | None = None
    rate: Sequence[float] | None = None


class LoadMode(Protocol):
    name: str

    def levels(self, load: Any) -> list[float]:
        """The load points' values (concurrency levels, rates), in order."""

    def label(self, value: float) -> str: ...

    def size(self, load: Any, value: float, seed: int) -> int:
        """Requests one point at `value` sends (warm-up included)."""

    async def drive(self, engine, items, load: Any, value: float, seed: int, tick: Tick,
                    out: list[LoadPoint]) -> LoadPoint: ...

    def override(self, load: Any, ov: LoadOverrides, log: Callable[[str], None]) -> dict[str, Any]:
        """Field updates for the command line's overrides."""

    def probe_load(self, load: Any, seed: int) -> ProbeLoad: ...


class ClosedMode:
    name = "closed"

    def levels(self, load: ClosedLoad) -> list[float]:
        return list(load.concurrency)

    def label(self, value: float) -> str:
        return f"concurrency {value:g}"

    def size(self, load: ClosedLoad, value: float, seed: int) -> int:
        return load.warmup_requests + load.requests

    async def drive(self, engine, items, load: ClosedLoad, value: float, seed: int, tick: Tick,
                    out: list[LoadPoint]) -> LoadPoint:
        return await run_closed(engine, items, int(value), load.requests, load.warmup_requests, load.timeout_s,
                                tick, out)

    def override(self, load: ClosedLoad, ov: LoadOverrides, log: Callable[[str], None]) -> dict[str, Any]:
        upd: dict[str, Any] = {}
        if ov.requests is not None:
            upd["requests"] = ov.requests
        if ov.concurrency:
            upd["concurrency"] = list(ov.concurrency)
        if ov.duration_s is not None:
            log("--duration applies to poisson load only; closed load counts requests")
        if ov.rate:
            log("--rate applies to poisson load only; closed load uses --concurrency")
        return upd

    def probe_load(self, load: ClosedLoad, seed: int) -> ProbeLoad:
        return ProbeLoad(seed, load.requests, None, 0.0, load.warmup_requests, load.timeout_s)


class PoissonMode:
    name = "poisson"

    def levels(self, load: PoissonLoad) -> list[float]:
        return list(load.rate)

    def label(self, value: float) -> str:
        return f"rate {value:g}/s"

    def schedule(self, load: PoissonLoad, value: float, seed: int):
        return poisson_schedule(value, seed, duration_s=load.duration_s, requests=load.requests,
                                warmup_s=load.warmup_s)

    def size(self, load: PoissonLoad, value: float, seed: int) -> int:
        return len(self.schedule(load, value, seed))

    async def drive(self, engine, items, load: PoissonLoad, value: float, seed: int, tick: Tick,
                    out: list[LoadPoint]) -> LoadPoint:
        return await run_poisson(engine, items, value, self.schedule(load, value, seed), load.warmup_s,
                                 load.timeout_s, tick, out)

    def override(self, load: PoissonLoad, ov: LoadOverrides, log: Callable[[str], None]) -> dict[str, Any]:
        upd: dict[str, Any] = {}
        if ov.requests is not None:
            upd["requests"] = ov.requests
            if ov.duration_s is None:  # a request count alone sizes the point
                upd["duration_s"] = None
        if ov.duration_s is not None:
            upd["duration_s"] = ov.duration_s
        if ov.rate:
            upd["rate"] = list(ov.rate)
        if ov.concurrency:
            log("--concurrency applies to closed load only; poisson load uses --rate")
        return upd

    def probe_load(self, load: PoissonLoad, seed: int) -> ProbeLoad:
        return ProbeLoad(seed, load.requests, load.duration_s, load.warmup_s, 0, load.timeout_s)


LOAD_MODES: dict[str, LoadMode] = {m.name: m for m in (ClosedMode(), PoissonMode())}

WARMUP_S_MOST = 5.0  # a closed scenario's warm-up requests, as seconds of Poisson arrivals, at most


def in_asked_mode(load: Any, ov: LoadOverrides, log: Callable[[str], None],
                  warmup_requests: int | None = None) -> Any:
    """The load in the mode the command line asks for: `--rate` alone makes a closed
    scenario's load Poisson arrivals at those rates, `--concurrency` alone a Poisson one's
    closed loops, each sized by the scenario's request count (a closed load's warm-up requests
    -- `warmup_requests` where given: a CPU run's limit -- become seconds at the slowest rate,
    at most WARMUP_S_MOST). Not validated here: the caller's revalidation names the flags.
    Both flags at once name two modes: ScenarioError."""
    if ov.rate and ov.concurrency:
        raise ScenarioError("--rate (Poisson arrivals) and --concurrency (closed loops) name two load modes: give one")
    if ov.rate and isinstance(load, ClosedLoad):
        warm = load.warmup_requests if warmup_requests is None else warmup_requests
        warmup_s = min(WARMUP_S_MOST, warm / min(ov.rate))
        log(f"--rate on a closed-loop scenario: Poisson arrivals at those rates instead, after {warmup_s:.3g} s "
            "of warm-up arrivals")
        return PoissonLoad.model_construct(mode="poisson", rate=list(ov.rate), requests=load.requests,
                                           duration_s=None, warmup_s=warmup_s, timeout_s=load.timeout_s)
    if ov.concurrency and isinstance(load, PoissonLoad):
        requests = load.requests or ClosedLoad.model_fields["requests"].default
        log("--concurrency on a Poisson scenario: closed loops at those levels instead")
        return ClosedLoad.model_construct(mode="closed", concurrency=list(ov.concurrency), requests=requests,
                                          warmup_requests=ClosedLoad.model_fields["warmup_requests"].default,
                                          timeout_s=load.timeout_s)
    return load


class UnknownLoadMode(ValueError):
    pass


def load_mode(load: Any) -> LoadMode:
    """The mode of a scenario's `load` (anything with a `mode` name)."""
    name = getattr(load, "mode", None)
    if name not in LOAD_MODES:
        raise UnknownLoadMode(f"unknown load mode {name!r}; known modes: {', '.join(sorted(LOAD_MODES))}")
    return LOAD_MODES[name]
