"""One real run of the smoke scenario (hf and noop, a few requests), shared by the report
tests: the report is built from its files."""
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def bench_run(out: Path, scenario: str = "smoke_prefill.yaml", *extra: str) -> Path:
    res = CliRunner().invoke(app, ["run", str(SCENARIOS / scenario), "--engine", "hf", "--engine", "noop",
                                   "--requests", "4", "--peak-tflops", "0.5", "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="session")
def prefill_run(tmp_path_factory) -> Path:
    return bench_run(tmp_path_factory.mktemp("prefill") / "run")
