"""What every `bench` command shares: the Typer app, the consoles, the exit codes, and the
scenario checked whole before anything runs (a bad one exits 2 with its message)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional
import typer
from rich.console import Console
from rich.markup import escape

from harness.scenario.errors import ScenarioError
from harness.scenario.files import load_scenario
from harness.strict_json import BadJson, loads


DTYPES = ("float32", "bfloat16", "float16")


app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark bounded-generation engines (bounded, hf, sglang, vllm, noop) on one scenario.")


console = Console(stderr=True)


out = Console(width=None if sys.stdout.isatty() else 120)


REPO = Path(__file__).resolve().parent.parent


EXIT_BAD_INPUT = 2  # a bad scenario, flag or input file: nothing ran


EXIT_SHORT = 3  # it ran, but an engine was skipped, failed to start, died, or measured nothing


def fail(msg: str, code: int = EXIT_BAD_INPUT) -> None:
    console.print("[red]error:[/red] " + escape(msg), highlight=False)
    raise typer.Exit(code)


def checked_scenario(path: Path, check: bool = True, **for_run):
    """The scenario at `path`, checked whole (harness.run.preflight) for a run with `for_run`'s
    engines, device and overrides; a bad one exits 2 with its message."""
    try:
        sc = load_scenario(path)
        if check:
            from harness.run.preflight import check_scenario

            check_scenario(sc, path, **for_run)
        return sc
    except ScenarioError as e:
        fail(str(e))


def check_writable(folder: Path) -> None:
    """Before any engine runs: results that cannot be written would be lost."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".writable").touch()
        (folder / ".writable").unlink()
    except OSError as e:
        fail(f"--out {folder}: cannot write there ({e.strerror})")


def kv_options(pairs: Optional[List[str]]) -> dict:
    """KEY=VALUE pairs; a value is parsed as JSON if it can be (strictly: NaN stays text)."""

    opts = {}
    for kv in pairs or []:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            fail(f"--option {kv!r}: expected KEY=VALUE, e.g. --option max_wait_ms=1")
        if k in opts:
            fail(f"--option {k}: given twice")
        try:
            opts[k] = loads(v.encode("utf-8", "surrogateescape"))
        except BadJson:
            opts[k] = v
    return opts
