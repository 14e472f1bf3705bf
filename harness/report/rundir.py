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
from harness.report.schema import FILLED, MAX_MS, REQUEST_RANGES, RESULT_RANGES, check_numbers, check_run_json

NEEDED = ("run.json", "results.csv")
# what every results.csv of `bench run` has (older runs lack the sweep's columns: read_results adds them)
RESULT_COLUMNS = ("engine", "load_mode", "load_value", "requests", "ok", "errors", "timeouts", "rejected", "mean_ms",
                  "p99_ms", "qps", "mfu")
TEXT_COLUMNS = ("engine", "cell", "status", "reason", "interrupted", "meets_slo", "recall_ref")


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
    def swept(self) -> list[str]:
        """The swept parameters (results.csv has a column for each); empty without a sweep."""
        return list((self.run.get("sweep") or {}).get("params") or [])

    @property
    def searches(self) -> list[dict[str, Any]]:
        """Every SLO search: {engine, cell, params, max_rate, probes, ...}."""
        if "slo_searches" in self.run:
            return list(self.run["slo_searches"])
        return [{"engine": e, "cell": "", "params": {}, **s} for e, s in (self.run.get("slo_search") or {}).items()]

    @property
    def measured_engines(self) -> list[str]:
        """Engines with at least one sweep point, in run order."""
        have = set(self.sweep["engine"])
        return [e for e in self.engines if e in have]


def _bool(col: pd.Series) -> pd.Series:
    return col.astype(str).str.lower().isin(["true", "1"])


def _check_text(df: pd.DataFrame, columns: tuple[str, ...], where: str) -> None:
    """Columns that name things (engine, load mode, status) must be filled."""
    for col in columns:
        blank = df[col].isna() | (df[col].astype(str).str.strip() == "")
        if blank.any():
            raise ValueError(f"{where}: row {int(blank.to_numpy().nonzero()[0][0]) + 2}, column {col}: blank")


def _stages(text: Any, where: str, i: int) -> str:
    """A request's stage times: blank, or a JSON object of milliseconds by stage."""
    if pd.isna(text) or not str(text).strip():
        return ""
    try:
        stages = json.loads(str(text))
    except json.JSONDecodeError:
        stages = None
    ok = isinstance(stages, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                          and 0 <= v <= MAX_MS for v in stages.values())
    if not ok:
        raise ValueError(f"{where}: row {i + 2}, column stages: not a JSON object of milliseconds per stage")
    return str(text)


def read_results(path: Path) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=["nan", "NaN", ""],
                         dtype={c: str for c in TEXT_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a results table of `bench run` ({e})") from None
    missing = [c for c in RESULT_COLUMNS if c not in df]
    if missing:
        raise ValueError(f"{path}: not a results table of `bench run` (no column {', '.join(missing)})")
    check_numbers(df, RESULT_RANGES, str(path), FILLED)
    _check_text(df, ("engine", "load_mode"), str(path))
    for c in ("p99_estimate", "fell_behind", "probe"):
        df[c] = _bool(df[c]) if c in df else False
    for c in TEXT_COLUMNS:  # older runs lack the sweep's columns: one cell, every point ok
        df[c] = df[c].fillna("").astype(str) if c in df else ("ok" if c == "status" else "")
    return df


def read_requests(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=["engine", "cell", "load_mode", "load_value", "warmup", "status", "latency_ms",
                                     "stages"])
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=["nan", "NaN"],
                         dtype={"stages": str, "error": str, "cell": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a requests table of `bench run` ({e})") from None
    missing = [c for c in ("engine", "load_mode", "load_value", "warmup", "status", "latency_ms") if c not in df]
    if missing:
        raise ValueError(f"{path}: not a requests table of `bench run` (no column {', '.join(missing)})")
    check_numbers(df, REQUEST_RANGES, str(path), {"load_value"})
    _check_text(df, ("engine", "load_mode", "status"), str(path))
    if "stages" in df:
        df["stages"] = [_stages(s, str(path), i) for i, s in enumerate(df["stages"])]
    df["warmup"] = _bool(df["warmup"])
    df["engine"] = df["engine"].astype(str)
    df["cell"] = df["cell"].fillna("").astype(str) if "cell" in df else ""
    return df


def load_run(path: str | Path) -> RunFiles:
    path = Path(path)
    missing = [n for n in NEEDED if not (path / n).exists()]
    if missing:
        raise ValueError(f"{path}: not a run folder (missing {', '.join(missing)}); "
                         f"a run folder is what `bench run` writes, e.g. reports/<run-id>/")
    try:
        run = json.loads((path / "run.json").read_text("utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / 'run.json'}: not valid JSON: {e.msg}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path / 'run.json'}: not UTF-8 text") from None
    check_run_json(run, str(path / "run.json"))
    return RunFiles(path, run, read_results(path / "results.csv"), read_requests(path / "requests.csv"),
                    read_outputs(path / "outputs.jsonl"))


def stage_times(requests: pd.DataFrame) -> pd.DataFrame:
    """Mean ms per stage for each engine, cell and load point (measured, answered requests),
    long form: engine, cell, load_mode, load_value, stage, ms. Empty when no engine reported
    stages."""
    rows = []
    cols = ["engine", "cell", "load_mode", "load_value", "stage", "ms"]
    ok = requests[(~requests["warmup"]) & (requests["status"] == "ok")]
    ok = ok[ok["stages"].fillna("").astype(str).str.startswith("{")]
    for (eng, cell, mode, value), g in ok.groupby(cols[:4], sort=False):
        stages = pd.DataFrame([json.loads(s) for s in g["stages"]])
        for stage, ms in stages.mean().items():
            rows.append(dict(zip(cols, (eng, cell, mode, value, stage, float(ms)))))
    return pd.DataFrame(rows, columns=cols)


def read_profile(path: Path) -> dict[str, Any] | None:
    """profile.json, which `bench profile --out` leaves in a run folder (None if absent);
    read as strictly as the run's own files."""
    f = Path(path) / "profile.json"
    if not f.exists():
        return None
    try:
        data = json.loads(f.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{f}: not valid JSON text ({type(e).__name__})") from None
    rows = data.get("classes") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("name"), str)
                                            and isinstance(r.get("ms"), (int, float)) for r in rows):
        raise ValueError(f"{f}: field classes: expected a list of rows with a name and ms")
    if not isinstance(data.get("request_ms"), (int, float)):
        raise ValueError(f"{f}: field request_ms: expected a number")
    return data
