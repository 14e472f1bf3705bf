"""One benchmark run: resolve the model, plan the sweep's cells (one cell without a sweep),
then for each engine run every cell at every load point (`harness.run.engine_run`), and
check the beams of every engine against the constrained reference. Outputs are written by
`harness.report`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.device.peak import device_peaks
from harness.load.loadgen import no_progress
from harness.load.modes import LoadOverrides, in_asked_mode, load_mode
from harness.measure.flops import model_shape
from harness.measure.metrics import P99_MIN_REQUESTS
from harness.measure.agreement import RECALL_REFERENCE, beam_recall, constrained_beams
from harness.run.engine_run import CellWorkloads, EngineRun, RunContext, run_engine
from harness.run.sweep import SweepPlan, plan_cells
from harness.scenario.engines import select_engines
from harness.scenario.errors import revalidated
from harness.scenario.schema import Scenario
from harness.workload.presets import resolve_model
from harness.workload.requests import load_tokenizer


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
    sweep: dict[str, list[Any]] | None = None  # --sweep NAME=V1,V2: replaces the scenario's values


def sharing_bound(workload) -> float:
    """The most an engine can beat the device's best rate by in effective MFU: 1, except on
    synthetic query + items requests, whose effective FLOPs count every item's whole
    concatenation while an engine computing the query once does (query + items) tokens'
    work: n (q + i) / (q + n i) at its largest (the longest query, shortest items, most
    items)."""
    if not workload.has_query:
        return 1.0
    most = lambda d: d if isinstance(d, int) else d.max  # noqa: E731
    q, i = most(workload.query_tokens), workload.item_tokens
    i, n = i if isinstance(i, int) else i.min, most(workload.items_per_request)
    return n * (q + i) / (q + n * i)


@dataclass
class RunResult:
    scenario: Scenario
    model_dir: str
    device: str
    peaks: Any  # harness.device.peak.Peaks: the rates per precision and the MFU denominator
    notes: list[str] = field(default_factory=list)
    engines: list[EngineRun] = field(default_factory=list)
    interrupted: bool = False
    plan: SweepPlan = field(default_factory=SweepPlan)

    @property
    def swept(self) -> list[str]:
        return self.plan.swept

    @property
    def peak_tflops(self) -> float:
        return self.peaks.mfu_tflops

    @property
    def peak_source(self) -> str:
        return self.peaks.why()

    @property
    def warnings(self) -> list[str]:
        out = []
        out += self.peaks.slow_host()
        for er in self.engines:
            out += emulation_warnings(er, self.peaks)
            out += er.warnings()
        few = [p.metrics.ok for er in self.engines for p in er.points if p.metrics.p99_estimate and p.metrics.ok]
        if few:
            out.append(f"P99 rests on fewer than {P99_MIN_REQUESTS} requests at {len(few)} load point(s) "
                       f"(min {min(few)}): those P99s are estimates")
        bound = sharing_bound(self.scenario.workload)  # an engine sharing each query may pass 100 % by that much
        over = max((p.metrics.mfu for er in self.engines if not (er.describe and er.describe.precision.low_precision)
                    for p in er.points
                    if p.metrics.mfu > bound), default=None)
        if over is not None:  # no engine beats the device's best rate: the peak is wrong
            out.append(f"effective MFU up to {over:.0%}: the peak of {self.peak_tflops:g} TFLOP/s "
                       f"({self.peak_source}) is below what the engines reached, most likely measured on a busy "
                       f"machine; measure it again on a quiet one (`bench doctor --measure`) or give --peak-tflops")
        return out

    def exit_code(self) -> int:
        """0 when every engine asked for started and measured; 3 when one was skipped, failed
        to start, was cut short or measured nothing (a failed sweep cell alone is data)."""
        return 3 if shortfalls(self) else 0


FLAGS = {"requests": "--requests", "duration_s": "--duration", "concurrency": "--concurrency", "rate": "--rate"}


def emulation_warnings(er: "EngineRun", peaks: Any) -> list[str]:
    if not er.describe or not er.computes:
        return []
    dtype = er.describe.precision.dtype
    why = peaks.emulated(dtype)
    return [f"{er.name}: computes in {dtype}, which this device emulates: {why}"] if why else []


def effective_load(scenario: Scenario, ov: Overrides, device: str, log: Callable[[str], None]):
    """The scenario's load with CPU limits and command-line overrides applied."""
    asked = LoadOverrides(ov.requests, ov.duration_s, ov.concurrency, ov.rate)
    cpu = scenario.cpu if device == "cpu" else None
    load = in_asked_mode(scenario.load, asked, log, cpu.warmup_requests if cpu is not None else None)
    upd: dict[str, Any] = {}
    names: dict[str, str] = {}
    if cpu is not None:
        cpu_upd = {k: v for k, v in cpu.model_dump().items() if v is not None and k in type(load).model_fields}
        if cpu_upd:
            log("on a CPU: using the scenario's cpu limits ("
                + ", ".join(f"{k}={v}" for k, v in cpu_upd.items()) + "), fewer requests than on a GPU; "
                "command-line flags override")
            upd.update(cpu_upd)
            names.update({k: f"field cpu.{k}" for k in cpu_upd})
    flags = load_mode(load).override(load, asked, log)
    upd.update(flags)
    names.update({k: FLAGS.get(k, f"field load.{k}") for k in flags})
    return revalidated(load, upd, names, "the run's load (scenario, cpu limits, command line)", "load.")


def shortfalls(result: RunResult) -> list[str]:
    """Why the run falls short of "every engine asked for started and measured at least one
    request" (empty when it does): what `bench run` turns into exit code 3. A failed sweep
    cell is a row, not a shortfall, while the engine measured other cells; an optional engine
    skipped because it cannot run here is not one either, unless no engine measured at all."""
    out = []
    for er in result.engines:
        measured = sum(p.metrics.ok for p in er.points)
        if er.skipped and er.optional:
            continue
        if er.skipped:
            out.append(f"{er.name}: skipped ({er.skipped})")
        elif er.failed:
            after = f" (after {measured} measured request{'s' * (measured != 1)})" if measured else ""
            out.append(f"{er.name}: {er.failed}{after}")
        elif not measured:
            ms = [p.metrics for p in er.points]
            why = (f"{sum(m.errors for m in ms)} errors, {sum(m.rejected for m in ms)} rejected, "
                   f"{sum(m.timeouts for m in ms)} timeouts") if ms else "no load points"
            starts = [p.reason for p in er.points if p.reason.startswith(("not run: failed to start",
                                                                         "not run: could not be created"))]
            out.append(f"{er.name}: measured no successful request ({why})" + (f"; {starts[0]}" if starts else ""))
    if result.engines and not out and not any(er.measured for er in result.engines):
        out.append("no engine ran: every one was optional and skipped ("
                   + "; ".join(f"{er.name}: {er.skipped}" for er in result.engines) + ")")
    return out


def attach_recall(engines: list[EngineRun]) -> None:
    """Each row's recall of the constrained reference's beams (`harness.measure.agreement`):
    the reference is hf when it answered, else the first constrained engine that did."""
    answered = [(er, constrained_beams(p.point for p in er.points)) for er in engines if er.constrained and er.computes]
    answered = [(er, beams) for er, beams in answered if beams]
    if not answered:
        return
    ref, want = next((a for a in answered if a[0].name == RECALL_REFERENCE), answered[0])
    for er in engines:
        for p in er.points:
            p.recall_ref = ref.name
            p.recall = beam_recall(constrained_beams([p.point]), want) if er is not ref else float("nan")


def run_scenario(scenario: Scenario, ov: Overrides, *, base_dir: Path | None = None,
                 log: Callable[[str], None] = print, progress=None, on_engine_done=None) -> RunResult:
    if ov.find_max_qps and scenario.slo.mean_ms is None and scenario.slo.p99_ms is None:
        raise ValueError(f"--find-max-qps needs an slo (mean_ms and/or p99_ms) in scenario {scenario.name!r}")
    device = ov.device or scenario.device
    notes: list[str] = []
    note = lambda m: (notes.append(m), log(m))  # noqa: E731
    load = effective_load(scenario, ov, device, note)
    plan = plan_cells(scenario, load, device, ov.sweep, note)
    model_dir = resolve_model(scenario.model, log)
    shape = model_shape(model_dir)
    if ov.peak_tflops is None:
        log("measuring the device's peak rates per precision (cached after the first time) ...")
    peaks = device_peaks(device, override=ov.peak_tflops).checked("start")
    result = RunResult(scenario, model_dir, device, peaks, notes, plan=plan)
    if plan.swept:
        log(f"sweep: {len(plan.cells)} cells ({'; '.join(c.label for c in plan.cells)}) x {len(load_mode(load).levels(load))} "
            f"load point(s); engines sized {'per cell' if plan.sizing == 'cell' else 'for the largest cell'}")
    ctx = RunContext(model_dir, device, load, shape, peaks.mfu_tflops, CellWorkloads(load_tokenizer(model_dir), base_dir),
                     log, progress or no_progress, scenario.slo if ov.find_max_qps else None)
    try:
        for spec in select_engines(scenario, ov.engines):
            # an optional entry stays optional only when the command line does not name it
            er = EngineRun(spec.title, optional=spec.optional and not ov.engines)
            result.engines.append(er)
            run_engine(er, spec, plan, ctx)
            attach_recall(result.engines)
            if on_engine_done:
                on_engine_done(result)
    except KeyboardInterrupt:
        result.interrupted = True
        log("interrupted: keeping what was measured")
    if not result.interrupted:
        result.peaks = result.peaks.checked("end")
    attach_recall(result.engines)
    return result
