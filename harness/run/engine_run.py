"""One engine through every cell of a run: start it sized for the cell (restarted when a cell
needs other bounds, and after it died), drive the cell's load points, and record each point
as a row with a status. A cell the engine refuses, fails to start for, dies in, or whose
requests all fail is a failed row with the reason and whatever figures it had; the engine
goes on with the next cell."""
from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engines.base import Bounds, Description, EngineDied, EngineUnavailable
from engines.registry import create_engine
from harness.measure.flops import ModelShape
from harness.measure.records import LoadPoint
from harness.load.modes import load_mode
from harness.measure.metrics import PointMetrics, idle_warnings, summarise, warnings_for
from harness.scenario.schema import EngineSpec
from harness.scenario.load import Slo
from harness.scenario.engines import engine_config
from harness.run.sweep import Cell, SweepPlan
from harness.workload.requests import Shifted, Unconstrained, build_workload
from harness.run.slo import run_search



@dataclass
class PointRun:
    """One row of results.csv: an engine at one load point of one cell."""

    cell: Cell
    point: LoadPoint
    metrics: PointMetrics
    status: str = "ok"  # ok | failed
    reason: str = ""  # why it failed; for an ok row, the requests that failed, if any
    recall: float = float("nan")  # mean share of the reference's beams this engine returned
    recall_ref: str = ""  # the reference engine


@dataclass
class EngineRun:
    name: str
    describe: Description | None = None  # what the engine said of itself at its (first) start
    start_s: float = float("nan")  # the first start
    starts: int = 0  # per-cell sizing and restarts after a death start an engine again
    points: list[PointRun] = field(default_factory=list)
    skipped: str = ""  # reason, when the engine could not run here
    failed: str = ""  # reason, when its run was cut short (died and could not be restarted)
    searches: list[tuple[Cell, Any]] = field(default_factory=list)  # (cell, harness.slo.SearchResult)
    constrained: bool = True  # its beam requests kept their item codes
    computes: bool = True
    optional: bool = False  # a skip is not a shortfall (scenario entry `optional: true`, not named by --engine)

    @property
    def measured(self) -> bool:
        return any(p.metrics.ok > 0 for p in self.points)

    def who(self, cell: Cell) -> str:
        """The engine as warnings name it in `cell`: with the cell's label where it has one."""
        return f"{self.name} ({cell.label})" if cell.label else self.name

    def warnings(self) -> list[str]:
        out = [f"{self.name}: skipped{' (optional)' * self.optional}: {self.skipped}"] if self.skipped else []
        out += [f"{self.name}: failed: {self.failed}"] if self.failed else []
        for p in self.points:
            if p.status == "failed":
                out.append(f"{self.who(p.cell)} @ {p.metrics.load_mode} {p.metrics.load_value:g}: failed: {p.reason}")
            else:
                out += warnings_for(self.who(p.cell), p.metrics)
        for label, cell in {p.cell.label: p.cell for p in self.points}.items():
            out += idle_warnings(self.who(cell), [p.metrics for p in self.points
                                                  if p.cell.label == label and p.status == "ok"])
        for cell, search in self.searches:
            out += search.warnings(self.who(cell))
        if not self.skipped and not self.failed and self.points and not self.measured:
            out.append(f"{self.name}: no request was answered at any load point")
        return out


class CellWorkloads:
    """Each cell's requests, built once and shared by every engine."""

    def __init__(self, tokenizer: Any, base_dir: Path | None):
        self.tokenizer, self.base_dir = tokenizer, base_dir
        self._built: dict[int, Any] = {}

    def items(self, cell: Cell, unconstrained: bool = False):
        if cell.index not in self._built:
            self._built[cell.index] = build_workload(cell.scenario, self.tokenizer, self.base_dir)
        items = self._built[cell.index]
        return Unconstrained(items) if unconstrained else items


@dataclass
class RunContext:
    """What every engine's run shares."""

    model_dir: str
    device: str
    load: Any
    shape: ModelShape
    peak: float
    workloads: CellWorkloads
    log: Callable[[str], None] = print
    progress: Any = None
    slo: Slo | None = None  # search the max rate under it (--find-max-qps)


async def drive(engine, items, load, seed: int, progress, points: list[LoadPoint], first: int = 0,
                label: str = "") -> int:
    """Run every load point, from request `first` of `items` on; each point lands in `points`
    as soon as it starts. The garbage collector is paused during a point: its full
    collections stall the sender for 100+ ms. -> the index after the last request planned."""
    gc.disable()
    try:
        return await _drive(engine, items, load, seed, progress, points, first, label)
    finally:
        gc.enable()


async def _drive(engine, items, load, seed, progress, points, first, label) -> int:
    # Each load point gets requests no earlier point sent (a server's prefix cache must not
    # turn a repeat into a free answer); every engine sees the same points, so the same requests.
    mode, offset = load_mode(load), first
    for value in mode.levels(load):
        n = mode.size(load, value, seed)
        view = Shifted(items, offset, n)
        gc.collect()
        with progress(f"{label} · {mode.label(value)}" if label else mode.label(value), n) as tick:
            await mode.drive(engine, view, load, value, seed, tick, points)
        offset += n
        if points[-1].interrupted.startswith("engine died"):
            raise EngineDied(points[-1].interrupted)
    return offset


def run_engine(er: EngineRun, spec: EngineSpec, plan: SweepPlan, ctx: RunContext) -> None:
    """Every cell of `plan` on engine `spec`, recording into `er`."""
    log = lambda m: ctx.log(f"[{er.name}] {m}")  # noqa: E731
    er.constrained = not spec.unconstrained
    engine, running, died = None, None, ""
    try:
        for cell in plan.cells:
            if engine is not None and running != cell.bounds and _resized(engine, cell.bounds):
                running = cell.bounds  # it took the cell's bounds without a restart
            if engine is None or running != cell.bounds:
                _stop(engine)
                engine, started = None, _start(er, spec, cell, ctx, log)
                if er.skipped:
                    return
                if isinstance(started, _Failed):
                    if died:  # it died in an earlier cell and does not come back: cut short
                        er.failed = er.failed or f"{died}; restart failed: {started.reason}"
                    elif not plan.swept:
                        er.failed = started.reason  # the run's only cell
                    _record(er, cell, [], ctx, started.reason)
                    continue
                engine, running, died = started, cell.bounds, ""
            died = run_cell(er, engine, spec, cell, ctx, log)
            if died:
                if not plan.swept:
                    er.failed = died  # the run's only cell was cut short
                elif cell is not plan.cells[-1]:
                    log(f"{died}; restarting it for the next cell")
                _stop(engine)
                engine = None
    finally:
        _stop(engine)


@dataclass
class _Failed:
    reason: str


def _start(er: EngineRun, spec: EngineSpec, cell: Cell, ctx: RunContext, log):
    """A started engine sized for `cell`; _Failed when it would not start for it (er.skipped
    is set when it never started and cannot run here)."""
    where = f" for {cell.label}" if cell.label else ""
    step = "could not be created"
    try:
        engine = create_engine(spec.name, engine_config(cell.scenario, spec, ctx.model_dir, ctx.device, cell.bounds))
        log(f"starting{where} ...")
        step, t = "failed to start", time.perf_counter()
        engine.start()
    except EngineUnavailable as e:
        if er.starts == 0:
            er.skipped = str(e)
            log(f"skipped: {e}")
        if step == "failed to start":
            _stop(engine)
        return _Failed(f"{step}: {e}")
    except Exception as e:  # out of memory, bounds it cannot plan for, ...: this cell fails
        log(f"{step}{where}: {type(e).__name__}: {e}")
        if step == "failed to start":
            _stop(engine)
        return _Failed(f"{step}: {type(e).__name__}: {e}")
    er.starts += 1
    if er.starts == 1:
        er.start_s, er.describe, er.computes = time.perf_counter() - t, engine.describe(), engine.computes
    log(f"started in {time.perf_counter() - t:.1f} s")
    return engine


def _resized(engine, bounds: Bounds) -> bool:
    try:
        return bool(engine.resize(bounds))
    except Exception:  # it could not: restart it instead
        return False


def _stop(engine) -> None:
    if engine is not None:
        try:
            engine.stop()
        except Exception:  # a dead engine may not stop cleanly; it is gone either way
            pass


def run_cell(er: EngineRun, engine, spec: EngineSpec, cell: Cell, ctx: RunContext, log) -> str:
    """The cell's load points (and SLO search) on a started engine -> why it died, or ''."""
    items = ctx.workloads.items(cell, spec.unconstrained)
    seed = cell.scenario.workload.seed
    points: list[LoadPoint] = []
    died = ""
    try:
        asyncio.run(drive(engine, items, ctx.load, seed, ctx.progress, points, cell.offset, cell.label))
    except Exception as e:  # EngineDied; or the harness failed around the engine: treat as dead, restart
        died = f"{type(e).__name__}: {e}"
    finally:
        _record(er, cell, points, ctx, died, engine.computes)
    if died:
        log(f"{cell.label + ': ' if cell.label else ''}{died}")
    elif ctx.slo is not None:
        died = _search(er, engine, items, cell, ctx, log)
    return died


def _search(er: EngineRun, engine, items, cell: Cell, ctx: RunContext, log) -> str:
    sweep = [p.metrics for p in er.points if p.cell is cell]
    peak = ctx.peak if engine.computes else float("nan")
    where = f"{cell.label}: " if cell.label else ""
    try:
        er.searches.append((cell, run_search(engine, items, ctx.slo, ctx.load, cell.scenario.workload.seed, sweep,
                                              ctx.shape, peak, ctx.progress, lambda m: log(where + m),
                                              first=cell.probe_offset)))
    except Exception as e:
        log(f"{where}SLO search failed: {type(e).__name__}: {e}")
        return f"{type(e).__name__}: {e}" if isinstance(e, EngineDied) else ""
    return ""


def _record(er: EngineRun, cell: Cell, points: list[LoadPoint], ctx: RunContext, died: str,
            computes: bool = True) -> None:
    """A row per load point of the cell, run or not."""
    mode = load_mode(ctx.load)
    peak = ctx.peak if computes else float("nan")
    for k, value in enumerate(mode.levels(ctx.load)):
        point = points[k] if k < len(points) else LoadPoint(mode.name, value)
        m = summarise(point, ctx.shape, peak)
        status, reason = point_status(point, m, died)
        er.points.append(PointRun(cell, point, m, status, reason))


def point_status(point: LoadPoint, m: PointMetrics, died: str = "") -> tuple[str, str]:
    """(ok | failed, reason): a point fails when nothing was answered or its engine died in it."""
    first = _first_error(point)
    failed = m.errors + m.timeouts + m.rejected
    if not point.records:
        return "failed", f"not run: {died or point.interrupted or 'no request sent'}"
    if point.interrupted.startswith("engine died"):
        return "failed", f"{point.interrupted} ({m.ok} of {m.requests} answered)"
    if m.ok == 0:
        what = point.interrupted or (f"all {m.requests} requests failed ({_kinds(m)})" if m.requests else
                                     "no measured request")
        return "failed", what + (f": {first}" if first else "")
    if failed:
        return "ok", f"{failed} of {m.requests} requests failed ({_kinds(m)}): {first}"
    return "ok", point.interrupted


def _kinds(m: PointMetrics) -> str:
    kinds = [(m.rejected, "rejected"), (m.timeouts, "timed out"), (m.errors, "errors")]
    return ", ".join(f"{n} {k}" for n, k in kinds if n)


def _first_error(point: LoadPoint) -> str:
    """The commonest error message of the point's failed requests, shortened."""
    errors = Counter(r.error for r in point.records if r.status in ("error", "rejected", "timeout") and r.error)
    return errors.most_common(1)[0][0][:300] if errors else ""
