"""results.csv (a row per engine x sweep cell x load point, each with its status) and
requests.csv (a row per request). A swept parameter is a column of both, named for it."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from harness.measure.metrics import record_tokens

RESULT_COLUMNS = [
    "scenario", "engine", "cell", "load_mode", "load_value", "status", "reason", "requests", "ok", "errors",
    "timeouts", "rejected", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "p99_estimate", "qps",
    "samples_per_s", "tokens_per_s", "beams_per_s", "generated_tokens_per_s", "items_per_s", "valid_code_rate",
    "recall", "recall_ref", "effective_tflops", "mfu", "peak_tflops", "window_s", "send_lag_p99_ms",
    "achieved_rate_ratio", "fell_behind", "interrupted", "probe", "meets_slo",
]
REQUEST_COLUMNS = [
    "engine", "cell", "load_mode", "load_value", "index", "request_id", "warmup", "status", "error",
    "scheduled_s", "sent_s", "done_s", "latency_ms", "send_lag_ms", "samples", "tokens", "stages",
]


def _with_params(columns: list[str], swept: list[str]) -> list[str]:
    """The swept parameters as columns, after `cell`."""
    at = columns.index("cell") + 1
    return columns[:at] + list(swept) + columns[at:]


def result_rows(result: Any) -> list[dict[str, Any]]:
    """The cells' points, then the SLO searches' probes (probe=True, meets_slo set)."""
    rows = []
    for er in result.engines:
        for p in er.points:
            rows.append({"scenario": result.scenario.name, "engine": er.name, "cell": p.cell.label,
                         **p.cell.values(), **p.metrics.row(), "status": p.status, "reason": p.reason,
                         "recall": p.recall, "recall_ref": p.recall_ref, "probe": False, "meets_slo": ""})
        for cell, search in er.searches:
            for probe in search.probes:
                status = "ok" if probe.metrics.ok else "failed"
                rows.append({"scenario": result.scenario.name, "engine": er.name, "cell": cell.label,
                             **cell.values(), **probe.metrics.row(), "status": status, "reason": probe.why,
                             "recall_ref": "", "probe": True, "meets_slo": probe.meets})
    return rows


def write_results_csv(result: Any, out_dir: Path, context: dict) -> Path:
    path = out_dir / "results.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, _with_params(RESULT_COLUMNS, result.swept), extrasaction="ignore")
        w.writeheader()
        for row in result_rows(result):
            w.writerow({k: _fmt(v) for k, v in row.items()})
    return path


def write_requests_csv(result: Any, out_dir: Path, context: dict) -> Path:
    path = out_dir / "requests.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(_with_params(REQUEST_COLUMNS, result.swept))
        for er in result.engines:
            for p in er.points:
                cell = [p.cell.label, *(_fmt(v) for v in p.cell.values().values())]
                for r in p.point.records:
                    w.writerow([er.name, *cell, p.point.mode, p.point.value, r.index, r.item.request.id, r.warmup,
                                r.status, r.error, _fmt(r.scheduled), _fmt(r.sent), _fmt(r.done),
                                _fmt(r.latency_ms), _fmt(r.send_lag_ms), r.item.samples, record_tokens(r),
                                json.dumps({k: round(v, 4) for k, v in r.stages.items()}) if r.stages else ""])
    return path


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v
