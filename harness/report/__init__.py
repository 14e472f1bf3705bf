"""Writers of a run's outputs, by name: each takes (RunResult, out_dir, context) and writes
one file. `write_all` runs them all, in order: report.html comes last because it is built
from the files written before it (the same path `bench report` takes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from harness.report.tables import write_requests_csv, write_results_csv
from harness.report.outputs import write_outputs_jsonl
from harness.report.provenance import write_run_json

Writer = Callable[[Any, Path, dict], Path]


def _write_report_html(result: Any, out_dir: Path, context: dict) -> Path:
    from harness.report.html import write_report_html  # jinja2 and matplotlib only when writing

    return write_report_html(result, out_dir, context)


WRITERS: dict[str, Writer] = {
    "results.csv": write_results_csv,
    "requests.csv": write_requests_csv,
    "run.json": write_run_json,
    "outputs.jsonl": write_outputs_jsonl,
    "report.html": _write_report_html,
}


def write_all(result: Any, out_dir: Path, context: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [writer(result, out_dir, context) for writer in WRITERS.values()]
