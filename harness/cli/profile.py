"""`bench profile`: where a request's time goes, by class, for one in-process engine."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from engines.base import EngineUnavailable
from harness.cli.common import EXIT_SHORT, app, check_writable, checked_scenario, console, fail, out
from harness.run.profile import ProfileError, label, profile_scenario, write


@app.command()
def profile(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    engine: str = typer.Option("bounded", "--engine", "-e", help="An in-process engine of the scenario (bounded, hf)."),
    requests: int = typer.Option(20, "--requests", "-n", min=1, max=10_000, help="Requests profiled, one at a time."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: the scenario's)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Folder (default reports/<time>-<scenario>-profile/); a run's folder adds the profile to its report."),
) -> None:
    """Profile N requests of SCENARIO on one engine and say where a request's time goes:
    GEMMs, attention, norms/elementwise, head + selection and host time, each with its floor."""
    sc = checked_scenario(scenario, engines=[engine], device=device)
    folder = out_dir or Path("reports") / (time.strftime("%Y%m%d-%H%M%S") + f"-{sc.name}-profile")
    check_writable(folder)
    log = lambda m: console.print(m, highlight=False, markup=False)  # noqa: E731
    try:
        p = profile_scenario(sc, engine, requests, device or sc.device, log=log, base_dir=scenario.parent)
    except ProfileError as e:
        fail(str(e))
    except EngineUnavailable as e:
        fail(f"engine {engine} cannot run here: {e}", EXIT_SHORT)
    table = Table(title=f"{p.scenario} · {p.engine} on {p.device}: {p.request_ms:.2f} ms a request "
                        f"({p.requests} requests, one at a time)")
    for col in ("class", "ms / request", "share", "work / request", "achieved", "floor ms"):
        table.add_column(col, justify="left" if col in ("class", "work / request") else "right")
    for r in p.rows:
        floor = "" if r.floor_ms is None else f"{r.floor_ms:.3f}"
        table.add_row(label(r.name), f"{r.ms:.3f}", f"{100 * r.share:.1f} %", r.work, r.rate, floor)
    out.print(table)
    for n in p.notes:
        console.print(f"note: {n}", highlight=False, markup=False)
    written = write(p, folder)
    if (folder / "run.json").exists():  # a run's folder: its report shows the profile too
        from harness.report.html import build_report  # matplotlib: only when writing

        written.append(build_report([folder], folder / "report.html"))
    console.print("wrote " + ", ".join(str(f) for f in written), highlight=False, markup=False)
