"""`bench soak`: a short soak of the hf engine behind `bench serve`, and its bounds."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.scenario.files import load_scenario
from harness.load.soak import SoakResult, SoakSpec, Window, run_soak, write_soak

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def test_short_soak_has_no_errors_and_reports_memory(tmp_path, tiny_dir):
    path = SCENARIOS / "smoke_prefill.yaml"
    spec = SoakSpec(minutes=0.1, fraction=0.5, window_s=2.0, concurrency=2, capacity_s=2.0, timeout_s=30)
    result = run_soak(load_scenario(path), path, "hf", spec, ["--concurrency", "2"], log=lambda m: None)
    assert result.capacity_qps > 0 and result.rate == pytest.approx(0.5 * result.capacity_qps)
    assert len(result.windows) >= 2 and result.requests > 0
    assert result.failed == 0, result.first_errors
    assert all(100 < w.rss_mb < 8000 for w in result.windows)  # a real process's resident set, in MB
    assert abs(result.growth) < 0.5
    paths = write_soak(result, spec, tmp_path, {"command": ["test"]})
    rows = list(csv.DictReader(open(paths[0])))
    assert len(rows) == len(result.windows) and float(rows[0]["rss_mb"]) == pytest.approx(result.windows[0].rss_mb, rel=1e-5)
    assert json.loads(paths[1].read_text())["failed"] == 0


def test_growth_is_last_window_over_first():
    r = SoakResult("x", 10, 5, 100, [Window(1, 200, 5, 5, 0, 1, 1, 1), Window(2, 230, 5, 5, 0, 1, 1, 1),
                                      Window(3, 210, 5, 5, 0, 1, 1, 1)])
    assert r.growth == pytest.approx(0.05) and r.requests == 15 and r.failed == 0


@pytest.mark.parametrize("args, says", [
    (["--minutes", "0"], "minutes must be in"), (["--minutes", "5", "--fraction", "1.5"], "fraction must be in"),
    (["--minutes", "100000"], "minutes must be in"),
    # each of these used to start a server and soak first: NaN windows crashed after the capacity
    # probe, a NaN or negative growth bound passed or failed any soak, an unwritable --out lost it all
    (["--minutes", "1", "--window", "nan"], "window (s) and capacity time must be in"),
    (["--minutes", "1", "--max-growth", "nan"], "--max-growth nan: give a fraction >= 0"),
    (["--minutes", "1", "--max-growth", "-1"], "--max-growth -1.0: give a fraction >= 0"),
    (["--minutes", "1", "--out", "/dev/null/x"], "--out /dev/null/x: cannot write there"),
])
def test_soak_refuses_unbounded_or_silly_settings(args, says):
    res = CliRunner().invoke(app, ["soak", str(SCENARIOS / "smoke_prefill.yaml"), "--engine", "noop", *args])
    assert res.exit_code == 2 and says in " ".join(res.output.split()), res.output
