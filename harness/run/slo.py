"""Max-QPS-under-SLO search: the highest Poisson rate at which an engine meets the scenario's
SLO (mean and P99 latency, every measured request answered), with a bounded number of
probes — exponential bracketing from a starting rate, then bisection.

Each probe is one Poisson load point of the scenario's size, driven by `harness.load.loadgen`
(latency from the scheduled send) and summarised by `harness.measure.metrics`, so a probe's numbers
mean what a sweep point's numbers mean. All probes use the same seed: their arrival times
are one draw scaled by 1/rate, so a higher rate is strictly more load.
"""
from __future__ import annotations

import asyncio
import gc
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from harness.measure.flops import ModelShape
from harness.measure.records import LoadPoint
from harness.load.loadgen import no_progress, run_poisson
from harness.load.modes import ProbeLoad, load_mode
from harness.measure.metrics import ACHIEVED_RATE_MIN, PointMetrics, idle_warnings, summarise, warnings_for
from harness.scenario.load import Slo
from harness.workload.requests import Shifted

MAX_PROBES = 8
REL_TOL = 0.02  # stop bisecting once the bracket is this narrow relative to its lower end
DEFAULT_START_RATE = 10.0
UNIT_SHAPE = ModelShape(1, 1, 1, 1, 1, 1, 1)  # FLOPs placeholder for engines without a model (tests)


@dataclass
class Probe:
    rate: float
    meets: bool
    why: str  # the bounds it missed; empty when it met the SLO
    metrics: PointMetrics
    point: LoadPoint | None = None


@dataclass
class SearchResult:
    slo: Slo
    probes: list[Probe] = field(default_factory=list)
    max_rate: float = float("nan")  # highest probed rate that met the SLO; NaN when none did
    lowest_failed: float = math.inf  # lowest probed rate that missed it

    @property
    def best(self) -> Probe | None:
        met = [p for p in self.probes if p.meets]
        return max(met, key=lambda p: p.rate) if met else None

    @property
    def goodput_qps(self) -> float:
        """Requests/s answered at the highest rate that met the SLO."""
        return self.best.metrics.qps if self.best else float("nan")

    def summary(self) -> dict[str, Any]:
        return {"slo": self.slo.model_dump(), "max_rate": self.max_rate, "goodput_qps": self.goodput_qps,
                "lowest_failed_rate": self.lowest_failed if math.isfinite(self.lowest_failed) else None,
                "probes": [{"rate": p.rate, "meets": p.meets, "why": p.why, "mean_ms": p.metrics.mean_ms,
                            "p99_ms": p.metrics.p99_ms, "qps": p.metrics.qps, "ok": p.metrics.ok,
                            "requests": p.metrics.requests, "fell_behind": p.metrics.fell_behind}
                           for p in self.probes]}

    def warnings(self, engine: str) -> list[str]:
        out = [w.replace(f"{engine} @ poisson", f"{engine} @ SLO probe", 1)
               for p in self.probes for w in warnings_for(engine, p.metrics)]
        if self.probes and not self.best:
            out.append(f"{engine}: SLO search: no probed rate met the SLO (lowest probed "
                       f"{min(p.rate for p in self.probes):.3g} req/s)")
        elif self.probes and not math.isfinite(self.lowest_failed):
            out.append(f"{engine}: SLO search: every probe met the SLO; the max rate is at least "
                       f"{self.max_rate:.3g} req/s (raise the start rate or the probe budget)")
        out += idle_warnings(f"{engine}: SLO search", [p.metrics for p in self.probes])
        return out


def verdict(m: PointMetrics, slo: Slo) -> tuple[bool, str]:
    """Whether a point meets the SLO, and if not, which bounds it missed."""
    missed = []
    if m.ok == 0:
        missed.append("no request answered")
    failed = m.errors + m.timeouts + m.rejected
    if failed:
        missed.append(f"{failed} request(s) failed")
    if slo.mean_ms is not None and not m.mean_ms <= slo.mean_ms:
        missed.append(f"mean {m.mean_ms:.1f} ms > {slo.mean_ms:g} ms")
    if slo.p99_ms is not None and not m.p99_ms <= slo.p99_ms:
        missed.append(f"P99 {m.p99_ms:.1f} ms > {slo.p99_ms:g} ms")
    return not missed, "; ".join(missed)


async def search_max_rate(probe: Callable[[float], Awaitable[bool | None]], start: float,
                          max_probes: int = MAX_PROBES, rel_tol: float = REL_TOL) -> tuple[float, float]:
    """(highest rate that met, lowest rate that missed), probing at most `max_probes` times:
    double from `start` while it meets (halve while it misses), then bisect the bracket.
    `probe(rate)` says True (met), False (missed) or None (missed, and no lower rate can
    meet: stop). The first is 0.0 when no probe met, the second inf when none missed."""
    if not start > 0:
        raise ValueError(f"the start rate must be > 0, got {start}")
    met, missed, rate = 0.0, math.inf, start
    for _ in range(max_probes):
        verdict = await probe(rate)
        if verdict:
            met = max(met, rate)
        else:
            missed = min(missed, rate)
            if verdict is None:
                break
        if math.isinf(missed):
            rate = met * 2
        elif met == 0.0:
            rate = missed / 2
        elif missed - met <= rel_tol * met:
            break
        else:
            rate = (met + missed) / 2
    return met, missed


def unreachable(point: LoadPoint, slo: Slo) -> bool:
    """True when the fastest answered request already exceeds a latency bound: queueing only
    adds to latency, so lowering the rate cannot help."""
    fastest = min((r.latency_ms for r in point.records if not r.warmup and r.status == "ok"), default=math.nan)
    bounds = [b for b in (slo.mean_ms, slo.p99_ms) if b is not None]
    return math.isfinite(fastest) and fastest > min(bounds)


def start_rate(sweep: Sequence[PointMetrics], default: float = DEFAULT_START_RATE) -> float:
    """Where to start: the highest throughput the sweep measured (near the engine's capacity)."""
    rates = [m.qps for m in sweep if m.ok and m.qps > 0 and math.isfinite(m.qps)]
    return max(rates) if rates else default


async def drive_probe(engine, items, load: ProbeLoad, rate: float, progress=None, first: int = 0) -> LoadPoint:
    """One Poisson point at `rate` over requests first.. of `items`, the garbage collector
    paused (its full collections stall the sender, see runner.drive)."""
    sched, warmup_s = load.schedule(rate)
    items = Shifted(items, first, len(sched))
    gc.collect()
    gc.disable()
    try:
        with (progress or no_progress)(f"SLO probe {rate:.4g}/s", len(sched)) as tick:
            return await run_poisson(engine, items, rate, sched, warmup_s, load.timeout_s, tick)
    finally:
        gc.enable()


async def find_max_qps(engine, items, slo: Slo, load: ProbeLoad, *, start: float, shape: ModelShape | None = None,
                       peak_tflops: float = float("nan"), max_probes: int = MAX_PROBES, progress=None,
                       log: Callable[[str], None] = lambda m: None, first: int = 0) -> SearchResult:
    """Search the highest Poisson rate at which `engine` meets `slo` (see module docstring).
    A probe where the client could not send at the rate counts as missed (the harness's
    ceiling); the search stops early once two probes had even their fastest request over
    the SLO (two, so that one stall of the machine does not end it). Each probe sends
    requests no earlier probe sent, from request `first` of `items` on."""
    if slo.mean_ms is None and slo.p99_ms is None:
        raise ValueError("the SLO search needs an slo with mean_ms and/or p99_ms in the scenario")
    result = SearchResult(slo)
    strikes, offset = 0, first

    async def probe(rate: float) -> bool | None:
        nonlocal strikes, offset
        point = await drive_probe(engine, items, load, rate, progress, first=offset)
        offset += len(point.records)  # a record per request sent
        m = summarise(point, shape or UNIT_SHAPE, peak_tflops)
        ok, why = verdict(m, slo)
        if not ok and unreachable(point, slo):
            strikes += 1
            why += "; even the fastest request was over the SLO" + (": no lower rate can meet it" if strikes > 1 else "")
        if m.achieved_rate_ratio < ACHIEVED_RATE_MIN:
            ok = False
            why = (f"the client sent at {m.achieved_rate_ratio:.0%} of this rate: the load generator's ceiling, "
                   "not the engine's" + (f"; {why}" if why else ""))
        result.probes.append(Probe(rate, ok, why, m, point))
        log(f"  SLO probe {rate:.4g} req/s: mean {m.mean_ms:.1f} ms, P99 {m.p99_ms:.1f} ms -> "
            + ("meets" if ok else f"misses ({why})"))
        return None if strikes > 1 else ok

    met, missed = await search_max_rate(probe, start, max_probes)
    result.max_rate = met if met > 0 else float("nan")
    result.lowest_failed = missed
    return result


def run_search(engine, items, slo: Slo, load, seed: int, sweep: Sequence[PointMetrics],
               shape: ModelShape, peak_tflops: float, progress=None, log=print, first: int = 0) -> SearchResult:
    """Synchronous entry for the runner: probes sized like the scenario's load points,
    starting from the sweep's highest throughput."""
    start = start_rate(sweep)
    log(f"searching the max rate under the SLO, from {start:.4g} req/s (at most {MAX_PROBES} probes) ...")
    probes = load_mode(load).probe_load(load, seed)
    return asyncio.run(find_max_qps(engine, items, slo, probes, start=start, shape=shape, peak_tflops=peak_tflops,
                                    progress=progress, log=log, first=first))

