"""`bench soak`: serve an engine with `bench serve` (a child process), measure its capacity
briefly through the `sglang` HTTP client, then drive it with Poisson arrivals at a fixed
fraction of that capacity for a bounded time, window by window, recording errors, latency
and the serving process's resident memory.

Capacity is the closed-loop throughput at `concurrency` clients. Memory growth compares the
resident set at the end of the last window with the end of the first (the first window
absorbs one-time allocations: allocator pools, compiled kernels, caches).
"""
from __future__ import annotations

import asyncio
import csv
import gc
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from harness.load.loadgen import poisson_schedule, run_closed, run_poisson
from harness.measure.metrics import summarise
from harness.workload.requests import Shifted
from engines.registry import create_engine
from harness.workload.presets import resolve_model
from harness.scenario.engines import engine_config
from harness.measure.flops import model_shape
from harness.scenario.schema import EngineSpec
from harness.load.process import ServeProcess
from harness.workload.requests import build_workload, load_tokenizer

Log = Callable[[str], None]
MAX_MINUTES = 24 * 60


@dataclass(frozen=True)
class SoakSpec:
    minutes: float
    fraction: float = 0.5
    window_s: float = 30.0  # one row of figures per window
    concurrency: int = 4  # closed-loop clients of the capacity probe
    capacity_s: float = 15.0  # about how long the capacity probe runs
    timeout_s: float = 30.0  # per request

    def __post_init__(self):
        if not 0 < self.minutes <= MAX_MINUTES:
            raise ValueError(f"minutes must be in (0, {MAX_MINUTES}]")
        if not 0 < self.fraction <= 1:
            raise ValueError("fraction must be in (0, 1]")
        if not (0 < self.window_s <= 3600 and 1 <= self.concurrency <= 10_000 and 0 < self.capacity_s <= 3600):
            raise ValueError("window (s) and capacity time must be in (0, 3600], concurrency in 1..10000")


@dataclass
class Window:
    end_s: float  # since the soak phase started
    rss_mb: float
    requests: int
    ok: int
    failed: int  # errors + timeouts + rejected
    mean_ms: float
    p99_ms: float
    qps: float


@dataclass
class SoakResult:
    engine: str
    capacity_qps: float
    rate: float
    baseline_rss_mb: float  # after the capacity probe
    windows: list[Window] = field(default_factory=list)
    first_errors: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(w.requests for w in self.windows)

    @property
    def failed(self) -> int:
        return sum(w.failed for w in self.windows)

    @property
    def growth(self) -> float:
        """Resident memory growth from the end of the first window to the end of the last."""
        if len(self.windows) < 2:
            return float("nan")
        return self.windows[-1].rss_mb / self.windows[0].rss_mb - 1


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


async def measure_capacity(client, items, spec: SoakSpec, shape) -> tuple[float, int]:
    """Closed-loop requests/s at spec.concurrency; returns it and the requests used."""
    c = spec.concurrency
    probe = await run_closed(client, items, c, 2 * c, c, spec.timeout_s)
    first = summarise(probe, shape, float("nan")).qps
    n = int(min(max(first * spec.capacity_s, 4 * c), 5000))
    point = await run_closed(client, Shifted(items, 3 * c, n), c, n, 0, spec.timeout_s)
    m = summarise(point, shape, float("nan"))
    if not m.ok:
        raise RuntimeError(f"capacity probe: no request succeeded ({point.records[0].error})")
    return m.qps, 3 * c + n


async def soak_windows(client, items, start: int, rate: float, spec: SoakSpec, pid: int, result: SoakResult,
                       shape, log: Log) -> None:
    t0, seed = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - t0) < spec.minutes * 60 - 0.5:
        window = min(spec.window_s, spec.minutes * 60 - elapsed)
        sched = poisson_schedule(rate, seed, duration_s=window)
        seed += 1
        part = Shifted(items, start, len(sched))
        start += len(sched)
        gc.collect()
        gc.disable()  # as in `bench run`: a full collection stalls the sender
        try:
            point = await run_poisson(client, part, rate, sched, 0.0, spec.timeout_s)
        finally:
            gc.enable()
        m = summarise(point, shape, float("nan"))
        w = Window(time.perf_counter() - t0, rss_mb(pid), m.requests, m.ok, m.errors + m.timeouts + m.rejected,
                   m.mean_ms, m.p99_ms, m.qps)
        result.windows.append(w)
        errors = [r.error for r in point.records if r.status not in ("ok", "cancelled")]
        result.first_errors += errors[: 5 - len(result.first_errors)]
        log(f"  {w.end_s:6.0f} s  rss {w.rss_mb:7.1f} MB  {w.ok}/{w.requests} ok  mean {w.mean_ms:6.1f} ms  "
            f"p99 {w.p99_ms:6.1f} ms")


def run_soak(scenario, scenario_path: Path, engine: str, spec: SoakSpec, serve_args: list[str] | None = None,
             log: Log = print) -> SoakResult:
    model_dir = resolve_model(scenario.model, log)
    items = build_workload(scenario, load_tokenizer(model_dir), scenario_path.parent)
    with ServeProcess(scenario_path, engine, serve_args or []) as serve:
        log(f"serving {engine} at {serve.url} (pid {serve.pid})")
        cfg = engine_config(scenario, EngineSpec(name="sglang", url=serve.url, timeout_s=spec.timeout_s),
                            model_dir, scenario.device)
        client = create_engine("sglang", cfg)
        client.start()
        try:
            return asyncio.run(_soak(client, items, spec, serve.pid, engine, model_shape(model_dir), log))
        finally:
            client.stop()


async def _soak(client, items, spec: SoakSpec, pid: int, engine: str, shape, log: Log) -> SoakResult:
    log(f"measuring capacity: closed loop, {spec.concurrency} clients, ~{spec.capacity_s:g} s ...")
    capacity, used = await measure_capacity(client, items, spec, shape)
    rate = spec.fraction * capacity
    result = SoakResult(engine, capacity, rate, rss_mb(pid))
    log(f"capacity {capacity:.2f} req/s; soaking at {rate:.2f} req/s ({spec.fraction:.0%}) for {spec.minutes:g} min; "
        f"rss {result.baseline_rss_mb:.1f} MB")
    await soak_windows(client, items, used, rate, spec, pid, result, shape, log)
    return result


def write_soak(result: SoakResult, spec: SoakSpec, out_dir: Path, context: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = out_dir / "soak.csv"
    with open(rows, "w", newline="") as f:
        w = csv.DictWriter(f, list(Window.__dataclass_fields__))
        w.writeheader()
        for win in result.windows:
            w.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in asdict(win).items()})
    summary = {**context, "spec": asdict(spec), "engine": result.engine, "capacity_qps": result.capacity_qps,
               "rate": result.rate, "baseline_rss_mb": result.baseline_rss_mb, "requests": result.requests,
               "failed": result.failed, "rss_growth": result.growth, "first_errors": result.first_errors,
               "windows": [asdict(w) for w in result.windows]}
    js = out_dir / "soak.json"
    js.write_text(json.dumps(summary, indent=2, default=str))
    return [rows, js]
