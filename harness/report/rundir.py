"""A run folder read back from disk (results.csv, requests.csv, run.json, outputs.jsonl): the
one input of the HTML report, whether it is written at the end of `bench run` or rebuilt
later by `bench report`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.report.outputs import Answers, read_outputs

NEEDED = ("run.json", "results.csv")


@dataclass
class RunFiles:
    path: Path
    run: dict[str, Any]  # run.json
    results: pd.DataFrame  # results.csv; `probe` is False for sweep points
    requests: pd.DataFrame  # requests.csv (empty if absent)
    outputs: Answers  # outputs.jsonl (empty if absent)

    @property
    def label(self) -> str:
        return self.run.get("run_id") or self.path.name

    @property
    def engines(self) -> list[str]:
        """Engines in the order they ran (skipped ones included)."""
        return [e["name"] for e in self.run.get("engines", [])]

    @property
    def sweep(self) -> pd.DataFrame:
        return self.results[~self.results["probe"]]

    @property
    def measured_engines(self) -> list[str]:
        """Engines with at least one sweep point, in run order."""
        have = set(self.sweep["engine"])
        return [e for e in self.engines if e in have]


def _bool(col: pd.Series) -> pd.Series:
    return col.astype(str).str.lower().isin(["true", "1"])


def read_results(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, keep_default_na=False, na_values=["nan", "NaN", ""],
                     dtype={"interrupted": str, "meets_slo": str, "engine": str})
    for c in ("p99_estimate", "fell_behind", "probe"):
        df[c] = _bool(df[c]) if c in df else False
    if "meets_slo" not in df:
        df["meets_slo"] = ""
    df["interrupted"] = df["interrupted"].fillna("").astype(str) if "interrupted" in df else ""
    df["engine"] = df["engine"].astype(str)
    return df


def read_requests(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=["engine", "load_mode", "load_value", "warmup", "status", "latency_ms", "stages"])
    df = pd.read_csv(path, keep_default_na=False, na_values=["nan", "NaN"], dtype={"stages": str, "error": str})
    df["warmup"] = _bool(df["warmup"])
    df["engine"] = df["engine"].astype(str)
    return df


def load_run(path: str | Path) -> RunFiles:
    path = Path(path)
    missing = [n for n in NEEDED if not (path / n).exists()]
    if missing:
        raise ValueError(f"{path}: not a run folder (missing {', '.join(missing)}); "
                         f"a run folder is what `bench run` writes, e.g. reports/<run-id>/")
    try:
        run = json.loads((path / "run.json").read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / 'run.json'}: not valid JSON: {e.msg}") from None
    return RunFiles(path, run, read_results(path / "results.csv"), read_requests(path / "requests.csv"),
                    read_outputs(path / "outputs.jsonl"))


def stage_times(requests: pd.DataFrame) -> pd.DataFrame:
    """Mean ms per stage for each engine and load point (measured, answered requests), long
    form: engine, load_mode, load_value, stage, ms. Empty when no engine reported stages."""
    rows = []
    ok = requests[(~requests["warmup"]) & (requests["status"] == "ok")]
    ok = ok[ok["stages"].fillna("").astype(str).str.startswith("{")]
    for (eng, mode, value), g in ok.groupby(["engine", "load_mode", "load_value"], sort=False):
        stages = pd.DataFrame([json.loads(s) for s in g["stages"]])
        for stage, ms in stages.mean().items():
            rows.append({"engine": eng, "load_mode": mode, "load_value": value, "stage": stage, "ms": float(ms)})
    return pd.DataFrame(rows, columns=["engine", "load_mode", "load_value", "stage", "ms"])
