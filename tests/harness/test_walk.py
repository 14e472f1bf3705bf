"""A request's walk through harness/ (issue 25): from `bench run` down to the engine's submit,
and back through the measure stage and into outputs.jsonl, enters each harness module at most
twice. Recorded on a real in-process run of the noop engine: at each of those three calls the
Python stack is read, bottom (the CLI) to top, as the harness files it passes through. (A
request's coroutine runs in a task of its own: its stack goes through the event loop to the
code that started the loop, not through the coroutine that spawned the task, load/modes.py.)"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from engines.noop import NoopEngine
from harness.cli import app
from harness.measure.metrics import summarise
from harness.report.outputs import result_line

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"
MAX_ENTRIES = 2
# the request's stops: into the engine, its record measured, its answer written
STOPS = {NoopEngine.submit.__code__: "submit", summarise.__code__: "measure", result_line.__code__: "outputs"}


def harness_walk(frame) -> list[str]:
    """The harness modules on the stack under `frame` (itself included), from the bottom, each
    stretch of consecutive frames in one module written once."""
    files = []
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(HARNESS):
            files.append(str(path.relative_to(HARNESS)))
        frame = frame.f_back
    walk = files[::-1]
    return [f for i, f in enumerate(walk) if i == 0 or walk[i - 1] != f]


def reentered(walk: list[str], limit: int = MAX_ENTRIES) -> dict[str, int]:
    return {m: n for m, n in Counter(walk).items() if n > limit}


def walks_of_a_run(out: Path) -> dict[str, list[str]]:
    """The walk at the first time each stop is reached in `bench run` of smoke_prefill on noop."""
    seen: dict[str, list[str]] = {}

    def profile(frame, event, arg):
        if event == "call" and (stop := STOPS.get(frame.f_code)) and stop not in seen:
            seen[stop] = harness_walk(frame)

    args = ["run", str(ROOT / "scenarios" / "smoke_prefill.yaml"), "--engine", "noop", "--requests", "2",
            "--peak-tflops", "1", "--out", str(out)]
    sys.setprofile(profile)
    try:
        res = CliRunner().invoke(app, args)
    finally:
        sys.setprofile(None)
    assert res.exit_code == 0, res.output
    return seen


def test_a_request_enters_each_harness_module_at_most_twice(tmp_path):
    walks = walks_of_a_run(tmp_path / "run")
    assert set(walks) == set(STOPS.values()), walks  # every stop reached, so each walk below was read
    for stop, walk in walks.items():
        assert walk[0] == "cli/run.py", (stop, walk)  # read from the CLI down
        assert reentered(walk) == {}, (stop, walk)
    assert {"load/loadgen.py", "run/engine_run.py"} <= set(walks["submit"])
    assert walks["outputs"][-1] == "report/outputs.py" and walks["measure"][-1] == "measure/metrics.py"


def test_the_walk_check_can_fail():
    assert reentered(["cli/run.py", "run/runner.py", "cli/run.py", "report/outputs.py"]) == {}
    assert reentered(["a.py", "b.py", "a.py", "c.py", "a.py"]) == {"a.py": 3}

    def inner():
        return harness_walk(sys._getframe())

    assert inner() == []  # a stack outside harness/ passes through no harness module
