"""The report's scenario table: what ran, beside what the file asked where the two differ.

A run's load is the file's, changed by the scenario's `cpu:` limits on a CPU and by the
command line (`--requests`, `--concurrency`, `--rate`, `--duration`). What ran is read back
from the run folder itself: the load points and measured requests of results.csv, the
warm-up requests of requests.csv."""
from __future__ import annotations

from typing import Any

from harness.report.rundir import RunFiles

LEVELS = {"closed": "concurrency", "poisson": "rate"}
MODE_WORDS = {"closed": "closed loop", "poisson": "Poisson arrivals"}


def _span(values: list[float]) -> str:
    values = sorted(set(values))
    if not values:
        return "–"
    return f"{values[0]:g}" if len(values) == 1 else f"{values[0]:g}–{values[-1]:g}"


def _levels(values: list[Any]) -> str:
    return ", ".join(f"{float(v):g}" for v in values)


def load_ran(run: RunFiles) -> dict[str, Any]:
    """{"ran": [(what, value, file value or None)], "mode": ...}: the load points, measured
    and warm-up requests per point as the run folder records them; the file's value beside
    each where it differs."""
    asked = (run.run.get("scenario") or {}).get("content", {}).get("load") or {}
    points = run.sweep
    if points.empty:
        return {"mode": asked.get("mode", ""), "ran": [], "differs": False}
    mode = str(points["load_mode"].iloc[0])
    levels = sorted(set(points["load_value"].tolist()))
    ok = points[points["status"] == "ok"]
    measured = (ok if not ok.empty else points)["requests"].tolist()
    req = run.requests
    warm = req[req["warmup"]].groupby(["engine", "cell", "load_value"]).size().tolist() if not req.empty else []
    level_name = LEVELS.get(mode, "load")
    rows = [(level_name, _levels(levels), _differs(levels, asked.get(level_name), _levels)),
            ("measured requests per point", _span(measured),
             _differs([float(m) for m in measured], asked.get("requests"), lambda v: f"{v:g}"))]
    if mode == "closed":
        rows.append(("warm-up requests per point", _span(warm or [0]),
                     _differs([float(w) for w in warm or [0]], asked.get("warmup_requests"), lambda v: f"{v:g}")))
    elif asked.get("duration_s") is not None:
        rows.append(("seconds per point (file)", f"{float(asked['duration_s']):g}", None))
    if asked.get("mode") not in (None, mode):  # the command line's --rate or --concurrency switched it
        rows.insert(0, ("mode", MODE_WORDS.get(mode, mode), MODE_WORDS.get(asked["mode"], asked["mode"])))
    return {"mode": MODE_WORDS.get(mode, mode), "ran": rows, "differs": any(f is not None for _, _, f in rows)}


def _differs(ran: list[float], asked: Any, show) -> str | None:
    """The file's value, shown, when it is not what ran (None when it is, or not given)."""
    if asked is None:
        return None
    if isinstance(asked, list):
        return None if sorted(float(a) for a in asked) == sorted(set(ran)) else _levels(asked)
    return None if set(ran) == {float(asked)} else show(float(asked))
