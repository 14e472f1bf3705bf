"""One benchmark run: resolve the model, build the workload, then for each engine start it,
drive every load point, and summarise. Outputs are written by `harness.report`."""
from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engines.base import EngineConfig, EngineDied, EngineUnavailable
from engines.registry import create_engine
from harness.flops import ModelShape
from harness.loadgen import no_progress, LoadPoint
from harness.loadmodes import LoadOverrides, load_mode
from harness.metrics import P99_MIN_REQUESTS, PointMetrics, summarise, warnings_for
from harness.presets import resolve_model
from harness.scenario import EngineSpec, Scenario, Slo, revalidated, select_engines
from harness.workload import Shifted, build_workload, load_tokenizer, scenario_bounds


@dataclass
class Overrides:
    """Command-line settings that take precedence over the scenario."""

    engines: list[str] = field(default_factory=list)
    requests: int | None = None
    duration_s: float | None = None
    device: str | None = None
    peak_tflops: float | None = None
    concurrency: list[int] | None = None
    rate: list[float] | None = None
    find_max_qps: bool = False  # search the highest Poisson rate meeting the scenario's SLO


@dataclass
class EngineRun:
    name: str
    describe: dict[str, Any] = field(default_factory=dict)
    start_s: float = float("nan")
    points: list[tuple[LoadPoint, PointMetrics]] = field(default_factory=list)
    skipped: str = ""  # reason, when the engine could not run here
    failed: str = ""  # reason, when it broke during the run
    search: Any = None  # harness.slo.SearchResult, with --find-max-qps


@dataclass
class RunResult:
    scenario: Scenario
    model_dir: str
    device: str
    peak_tflops: float
    peak_source: str
    notes: list[str] = field(default_factory=list)
    engines: list[EngineRun] = field(default_factory=list)
    interrupted: bool = False

    @property
    def warnings(self) -> list[str]:
        out = []
        for er in self.engines:
            out += [f"{er.name}: skipped: {er.skipped}"] if er.skipped else []
            out += [f"{er.name}: failed: {er.failed}"] if er.failed else []
            for _, m in er.points:
                out += warnings_for(er.name, m)
            out += er.search.warnings(er.name) if er.search else []
        few = [m.ok for er in self.engines for _, m in er.points if m.p99_estimate and m.ok]
        if few:
            out.append(f"P99 rests on fewer than {P99_MIN_REQUESTS} requests at {len(few)} load point(s) "
                       f"(min {min(few)}): those P99s are estimates")
        return out


FLAGS = {"requests": "--requests", "duration_s": "--duration", "concurrency": "--concurrency", "rate": "--rate"}


def effective_load(scenario: Scenario, ov: Overrides, device: str, log: Callable[[str], None]):
    """The scenario's load with CPU limits and command-line overrides applied."""
    load = scenario.load
    upd: dict[str, Any] = {}
    names: dict[str, str] = {}
    cpu = scenario.cpu if device == "cpu" else None
    if cpu is not None:
        cpu_upd = {k: v for k, v in cpu.model_dump().items() if v is not None and k in type(load).model_fields}
        if cpu_upd:
            log("on a CPU: using the scenario's cpu limits ("
                + ", ".join(f"{k}={v}" for k, v in cpu_upd.items()) + "), fewer requests than on a GPU; "
                "command-line flags override")
            upd.update(cpu_upd)
            names.update({k: f"field cpu.{k}" for k in cpu_upd})
    flags = load_mode(load).override(load, LoadOverrides(ov.requests, ov.duration_s, ov.concurrency, ov.rate), log)
    upd.update(flags)
    names.update({k: FLAGS.get(k, f"field load.{k}") for k in flags})
    return revalidated(load, upd, names, "the run's load (scenario, cpu limits, command line)", "load.")


def engine_config(scenario: Scenario, spec: EngineSpec, model_dir: str, device: str) -> EngineConfig:
    return EngineConfig(Path(model_dir), scenario.dtype, device, scenario_bounds(scenario), scenario.task.kind,
                        spec.options)


async def drive(engine, items, load, seed: int, progress, points: list[LoadPoint]) -> int:
    """Run every load point; each point lands in `points` as soon as it starts. The garbage
    collector is paused during a point: its full collections stall the sender for 100+ ms.
    -> how many requests of `items` the points used (later probes start there)."""
    gc.disable()
    try:
        return await _drive(engine, items, load, seed, progress, points)
    finally:
        gc.enable()


async def _drive(engine, items, load, seed: int, progress, points: list[LoadPoint]) -> int:
    # Each load point gets requests no earlier point sent (a server's prefix cache must not
    # turn a repeat into a free answer); every engine sees the same points, so the same requests.
    mode, offset = load_mode(load), 0
    for value in mode.levels(load):
        n = mode.size(load, value, seed)
        view = Shifted(items, offset, n)
        gc.collect()
        with progress(mode.label(value), n) as tick:
            await mode.drive(engine, view, load, value, seed, tick, points)
        offset += n
        _stop_if_died(points[-1])
    return offset


def _stop_if_died(point: LoadPoint) -> None:
    if point.interrupted.startswith("engine died"):
        raise EngineDied(point.interrupted)


def run_engine(er: EngineRun, spec: EngineSpec, cfg: EngineConfig, items, load, seed: int,
               shape: ModelShape, peak: float, log, progress, slo: Slo | None = None) -> None:
    try:
        engine = create_engine(spec.name, cfg)
    except EngineUnavailable as e:
        er.skipped = str(e)
        log(f"[{spec.name}] skipped: {e}")
        return
    except Exception as e:  # a broken engine ends its own part of the run, not the run
        er.failed = f"could not be created: {type(e).__name__}: {e}"
        log(f"[{spec.name}] failed: {er.failed}")
        return
    log(f"[{spec.name}] starting ...")
    t = time.perf_counter()
    try:
        engine.start()
    except EngineUnavailable as e:
        er.skipped = str(e)
        log(f"[{spec.name}] skipped: {e}")
        _stop_quietly(engine, log)
        return
    except Exception as e:
        er.failed = f"failed to start: {type(e).__name__}: {e}"
        log(f"[{spec.name}] {er.failed}")
        _stop_quietly(engine, log)
        return
    er.start_s = time.perf_counter() - t
    er.describe = engine.describe()
    log(f"[{spec.name}] started in {er.start_s:.1f} s")
    points: list[LoadPoint] = []
    try:
        used = asyncio.run(drive(engine, items, load, seed, progress, points))
        if slo is not None:
            from harness.slo import run_search

            sweep = [summarise(p, shape, peak) for p in points]
            er.search = run_search(engine, items, slo, load, seed, sweep, shape, peak if engine.computes
                                   else float("nan"), progress, lambda m: log(f"[{spec.name}] {m}"), first=used)
    except Exception as e:  # an engine that breaks ends its own part of the run, not the run
        er.failed = f"{type(e).__name__}: {e}"
        log(f"[{spec.name}] failed: {er.failed}")
    finally:
        er.points = [(p, summarise(p, shape, peak if engine.computes else float("nan"))) for p in points]
        _stop_quietly(engine, log)


def _stop_quietly(engine, log) -> None:
    try:
        engine.stop()
    except Exception as e:  # noqa: BLE001 - the start failure is the news; this is a footnote
        log(f"[{engine.name}] stopping after the failed start also failed: {type(e).__name__}: {e}")


def shortfalls(result: RunResult) -> list[str]:
    """Why the run falls short of "every engine asked for started and measured at least one
    request" (empty when it does): what `bench run` turns into exit code 3."""
    out = []
    for er in result.engines:
        measured = sum(m.ok for _, m in er.points)
        if er.skipped:
            out.append(f"{er.name}: skipped ({er.skipped})")
        elif er.failed:
            after = f" (after {measured} measured request{'s' * (measured != 1)})" if measured else ""
            out.append(f"{er.name}: {er.failed}{after}")
        elif not measured:
            errs = [m for _, m in er.points]
            why = (f"{sum(m.errors for m in errs)} errors, {sum(m.rejected for m in errs)} rejected, "
                   f"{sum(m.timeouts for m in errs)} timeouts") if errs else "no load points"
            out.append(f"{er.name}: measured no successful request ({why})")
    return out


def run_scenario(scenario: Scenario, ov: Overrides, *, base_dir: Path | None = None,
                 log: Callable[[str], None] = print, progress=None, on_engine_done=None) -> RunResult:
    if ov.find_max_qps and scenario.slo.mean_ms is None and scenario.slo.p99_ms is None:
        raise ValueError(f"--find-max-qps needs an slo (mean_ms and/or p99_ms) in scenario {scenario.name!r}")
    device = ov.device or scenario.device
    model_dir = resolve_model(scenario.model, log)
    shape = model_shape(model_dir)
    if ov.peak_tflops is not None:
        peak, source = ov.peak_tflops, "given on the command line"
    else:
        from harness.peak import peak_tflops

        log("measuring the device's peak (cached after the first time) ...")
        peak, source = peak_tflops(device, scenario.dtype)
    result = RunResult(scenario, model_dir, device, peak, source)
    load = effective_load(scenario, ov, device, lambda m: (result.notes.append(m), log(m)))
    items = build_workload(scenario, load_tokenizer(model_dir), base_dir)
    specs = select_engines(scenario, ov.engines)
    progress = progress or no_progress
    try:
        for spec in specs:
            er = EngineRun(spec.title)
            result.engines.append(er)
            run_engine(er, spec, engine_config(scenario, spec, model_dir, device), items, load,
                       scenario.workload.seed, shape, peak, log, progress,
                       scenario.slo if ov.find_max_qps else None)
            if on_engine_done:
                on_engine_done(result)
    except KeyboardInterrupt:
        result.interrupted = True
        log("interrupted: keeping what was measured")
    return result



def model_shape(model: str) -> ModelShape:
    if Path(model).is_dir():
        return ModelShape.from_dir(model)
    from transformers import AutoConfig

    return ModelShape.from_config(AutoConfig.from_pretrained(model).to_dict())
