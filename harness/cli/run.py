"""`bench run`, `bench report`, `bench scenarios`, `bench compile`: a scenario's benchmark and
its report."""
from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path
from typing import List, Optional
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.scenario.errors import ScenarioError
from harness.scenario.files import load_scenario
from harness.scenario.engines import select_engines
from harness.cli.common import EXIT_SHORT, REPO, check_writable, fail, checked_scenario, app, console, out
from harness.report import write_all
from harness.run.runner import Overrides, run_scenario, shortfalls
from harness.run.sweep import parse_sweep_option
from harness.scenario.task import BeamTaskSpec
from harness.run.compile import compile_scenario


class _Progress:
    """A rich progress bar per load point; ticks are cheap (the bar refreshes on its own)."""

    def __init__(self, console: Console):
        self.console = console

    @contextlib.contextmanager
    def __call__(self, label: str, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=self.console, transient=True, refresh_per_second=5) as p:
            task = p.add_task(label, total=total)
            yield lambda n=1: p.advance(task, n)


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    engine: Optional[List[str]] = typer.Option(None, "--engine", "-e", help="Engine(s) to run instead of the scenario's."),
    requests: Optional[int] = typer.Option(None, help="Measured requests per load point."),
    duration: Optional[float] = typer.Option(None, help="Seconds per Poisson load point."),
    concurrency: Optional[List[int]] = typer.Option(None, help="Closed-loop concurrency level(s)."),
    rate: Optional[List[float]] = typer.Option(None, help="Poisson rate(s), requests/s."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: the scenario's)."),
    peak_tflops: Optional[float] = typer.Option(None, help="Peak TFLOP/s for MFU instead of the measured/table value."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Run folder (default reports/<run-id>/)."),
    find_max_qps: bool = typer.Option(False, "--find-max-qps", help="Also search each engine's highest Poisson rate meeting the scenario's SLO."),
    baseline: Optional[str] = typer.Option(None, help="Engine the report compares the others to (default: the first)."),
    sweep: Optional[List[str]] = typer.Option(None, "--sweep", help="Sweep a parameter: NAME=V1,V2,... e.g. beam_width=25,100,400 (replaces the scenario's values; repeatable)."),
) -> None:
    """Run SCENARIO against its engines; write results.csv, requests.csv, run.json, outputs.jsonl, report.html.

    Exit code: 0 when every engine started and measured; 3 when one was skipped, failed to
    start, died and was cut short, or measured nothing (a failed sweep cell is a row, not an
    exit code; an `optional: true` entry that cannot run here is skipped without exit 3 unless
    --engine names it); 2 for bad input; 130 when interrupted."""

    try:
        swept = parse_sweep_option(sweep or []) or None
    except ValueError as e:
        fail(str(e))
    ov = Overrides(engines=engine or [], requests=requests, duration_s=duration, device=device,
                   peak_tflops=peak_tflops, concurrency=concurrency or None, rate=rate or None,
                   find_max_qps=find_max_qps, sweep=swept)
    sc = checked_scenario(scenario, engines=ov.engines or None, device=device, overrides=ov)
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{sc.name}"
    folder = out_dir or Path("reports") / run_id
    names = [s.title for s in select_engines(sc, ov.engines)]
    if baseline is not None and baseline not in names:
        fail(f"--baseline {baseline!r} is not an engine of this run; engines: {', '.join(names)}")
    check_writable(folder)
    ctx = {"run_id": run_id, "scenario_path": str(scenario), "scenario_text": scenario.read_text("utf-8-sig"),
           "command": sys.argv, "baseline": baseline}
    log = lambda m: console.print(m, highlight=False, markup=False)  # noqa: E731
    # write after every engine, so an interrupted or crashed run keeps what it measured
    try:
        result = run_scenario(sc, ov, base_dir=scenario.parent, log=log, progress=_Progress(console),
                              on_engine_done=lambda r: write_all(r, folder, ctx))
    except (ValueError, OSError) as e:
        fail(str(e))
    _finish(result, write_all(result, folder, ctx), folder)


def _finish(result, paths: list[Path], folder: Path) -> None:
    """The summary, the warnings, what was written, and the exit code of `bench run`."""
    _print_summary(result)
    for w in result.warnings:
        console.print("[yellow]warning:[/yellow] " + escape(w), highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
    console.print(f"report: {folder / 'report.html'}", highlight=False)
    if result.interrupted:
        raise typer.Exit(130)
    short = shortfalls(result)
    if short:  # exit 3: a CI job must be able to tell that an engine did not run
        for line in short:
            console.print("[red]not measured:[/red] " + escape(line), highlight=False)
        raise typer.Exit(EXIT_SHORT)


def _num(v: float, spec: str) -> str:
    return "-" if v != v else format(v, spec)


def _print_summary(result) -> None:
    beam = isinstance(result.scenario.task, BeamTaskSpec)
    codes = any(p.metrics.valid_code_rate == p.metrics.valid_code_rate for er in result.engines for p in er.points)
    which = "" if result.peaks.override is not None else f" {result.peaks.mfu_precision}"
    t = Table(title=f"{result.scenario.name} on {result.device} (peak {result.peak_tflops:.3g} TFLOP/s{which})")
    cols = ["engine", "mode"] + (["cell"] if result.swept else []) + ["load", "ok/req", "mean ms", "p99 ms", "req/s",
                                                                       "beams/s" if beam else "items/s", "MFU"]
    for col in cols + (["valid codes", "recall"] if codes else []) + ["status"]:
        t.add_column(col, justify="right")
    for er in result.engines:
        mode = er.describe.mode if er.describe else ""  # how the engine serves, e.g. "eager (AOT failed)"
        if er.skipped:
            t.add_row(er.name, mode, *["-"] * (len(t.columns) - 3), "skipped (optional)" if er.optional else "skipped")
        for p in er.points:
            m = p.metrics
            cell = [p.cell.label] if result.swept else []
            p99 = _num(m.p99_ms, ".1f") + ("*" if m.p99_estimate and m.ok else "")
            extra = [_num(m.valid_code_rate, ".1%"), _num(p.recall, ".1%")] if codes else []
            t.add_row(er.name, mode, *cell, f"{m.load_mode} {m.load_value:g}", f"{m.ok}/{m.requests}",
                      _num(m.mean_ms, ".1f"), p99, _num(m.qps, ".3g"),
                      _num(m.beams_per_s if beam else m.items_per_s, ".4g"), _num(m.mfu, ".1%"), *extra,
                      p.status if p.status == "ok" else "[red]failed[/red]")
    out.print(t)
    if any(p.metrics.p99_estimate and p.metrics.ok for er in result.engines for p in er.points):
        out.print("* P99 on fewer than 459 requests: an estimate", style="dim")
    for er in result.engines:
        if er.describe and er.describe.fallback:
            out.print(f"[yellow]{escape(er.name)} does not serve as asked:[/yellow] {escape(er.describe.fallback)}",
                      highlight=False)
    for er in result.engines:
        for cell, search in er.searches:
            where = f" ({cell.label})" if cell.label else ""
            if math.isnan(search.max_rate):  # the search's warning says which rates were probed
                out.print(f"{er.name}{where}: max rate under the SLO: none ({len(search.probes)} probes)")
                continue
            out.print(f"{er.name}{where}: max rate under the SLO {search.max_rate:.4g} req/s "
                      f"(goodput {search.goodput_qps:.4g} req/s, {len(search.probes)} probes)")


@app.command()
def report(
    run_dirs: List[Path] = typer.Argument(..., help="Run folder(s) written by `bench run`; several are compared."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Page to write (default RUN_DIR/report.html for one "
                                            "run, reports/compare-<time>/report.html for several)."),
    baseline: Optional[str] = typer.Option(None, help="Engine the others are compared to (default: each run's first)."),
) -> None:
    """Rebuild a run's report.html from its files, or compare several runs in one page."""
    from harness.report.html import build_report

    if out_file is None:
        out_file = (run_dirs[0] if len(run_dirs) == 1
                    else Path("reports") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}") / "report.html"
    try:
        path = build_report(run_dirs, out_file, baseline)
    except (ValueError, OSError) as e:
        fail(str(e))
    console.print(f"report: {path}", highlight=False)


@app.command()
def scenarios(folder: Path = typer.Argument(REPO / "scenarios", help="Folder of scenario files.")) -> None:
    """List scenario files, one line each."""
    if not folder.is_dir():  # a file or a typo listed nothing, and looked like an empty folder
        fail(f"{folder}: not a folder of scenario files")
    t = Table(show_header=True)
    for col in ("file", "name", "model", "task"):
        t.add_column(col, no_wrap=True)
    t.add_column("description")
    for path in sorted(folder.glob("*.yaml")):
        try:
            sc = load_scenario(path)  # the file alone: listing should not load every model
            t.add_row(path.name, sc.name, sc.model, sc.task.kind, sc.description)
        except ScenarioError as e:
            t.add_row(path.name, "[red]invalid[/red]", "", "", str(e).splitlines()[-1].strip())
    out.print(t)


@app.command()
def compile(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: the scenario's)."),
) -> None:
    """Compile the bounded engine's graphs for SCENARIO ahead of time (cached on disk), and
    judge each low-precision plan with the accuracy gate. With several bounded entries (e.g.
    float and int8), each one; the status is then keyed by their labels."""
    sc = checked_scenario(scenario, engines=["bounded"], device=device)
    status, refused = compile_scenario(sc, device or sc.device, log=lambda m: console.print(m, highlight=False,
                                                                                        markup=False))
    out.print_json(data=status if len(status) > 1 else next(iter(status.values())), default=str)
    for r in refused:
        console.print("[red]error:[/red] " + escape(r), highlight=False)
    if refused:
        raise typer.Exit(1)
