"""results.csv (a row per engine x load point) and requests.csv (a row per request)."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from harness.metrics import record_tokens

RESULT_COLUMNS = [
    "scenario", "engine", "load_mode", "load_value", "requests", "ok", "errors", "timeouts", "rejected",
    "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "p99_estimate", "qps", "samples_per_s",
    "tokens_per_s", "effective_tflops", "mfu", "peak_tflops", "window_s", "send_lag_p99_ms",
    "achieved_rate_ratio", "fell_behind", "interrupted", "probe", "meets_slo",
]
REQUEST_COLUMNS = [
    "engine", "load_mode", "load_value", "index", "request_id", "warmup", "status", "error",
    "scheduled_s", "sent_s", "done_s", "latency_ms", "send_lag_ms", "samples", "tokens", "stages",
]


def result_rows(result: Any) -> list[dict[str, Any]]:
    """The sweep's points, then the SLO search's probes (probe=True, meets_slo set)."""
    rows = []
    for er in result.engines:
        for _, m in er.points:
            rows.append({"scenario": result.scenario.name, "engine": er.name, **m.row(), "probe": False,
                         "meets_slo": ""})
        for p in er.search.probes if getattr(er, "search", None) else []:
            rows.append({"scenario": result.scenario.name, "engine": er.name, **p.metrics.row(), "probe": True,
                         "meets_slo": p.meets})
    return rows


def write_results_csv(result: Any, out_dir: Path, context: dict) -> Path:
    path = out_dir / "results.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, RESULT_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in result_rows(result):
            w.writerow({k: _fmt(v) for k, v in row.items()})
    return path


def write_requests_csv(result: Any, out_dir: Path, context: dict) -> Path:
    path = out_dir / "requests.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUEST_COLUMNS)
        for er in result.engines:
            for point, _ in er.points:
                for r in point.records:
                    w.writerow([er.name, point.mode, point.value, r.index, r.item.request.id, r.warmup,
                                r.status, r.error, _fmt(r.scheduled), _fmt(r.sent), _fmt(r.done),
                                _fmt(r.latency_ms), _fmt(r.send_lag_ms), r.item.samples, record_tokens(r),
                                json.dumps({k: round(v, 4) for k, v in r.stages.items()}) if r.stages else ""])
    return path


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v
