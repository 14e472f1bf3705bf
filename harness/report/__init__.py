"""Writers of a run's outputs, by name: each takes (RunResult, out_dir, context) and writes
one file. `write_all` runs them all; an unknown name lists the known ones."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from harness.report.tables import write_requests_csv, write_results_csv
from harness.report.provenance import write_run_json

Writer = Callable[[Any, Path, dict], Path]

WRITERS: dict[str, Writer] = {
    "results.csv": write_results_csv,
    "requests.csv": write_requests_csv,
    "run.json": write_run_json,
}


def write_all(result: Any, out_dir: Path, context: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [writer(result, out_dir, context) for writer in WRITERS.values()]
