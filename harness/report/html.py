"""report.html: one self-contained page (inline CSS, figures as base64 PNG, no network) for a
run, or for several runs compared (before/after a change), built only from run folders on
disk — so the page written at the end of `bench run` and the one `bench report` rebuilds
come from the same code.

Contents per run: scenario and provenance, warnings, a summary table per engine and load
point with each engine's ratio to a baseline engine, the SLO search, figures (latency vs
load with the SLO, latency CDF, effective MFU, per-stage times, SLO probes), agreement of
answers with the baseline, and the MFU formula with the peak used.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Sequence

from jinja2 import Environment, PackageLoader, select_autoescape

from harness.agreement import agreement
from harness.report import plots
from harness.report.rundir import RunFiles, load_run, stage_times

COMPARED = [("mean_ms", "mean ms", "ms"), ("p99_ms", "P99 ms", "ms"), ("qps", "req/s", "g"),
            ("samples_per_s", "samples/s", "g"), ("mfu", "MFU", "pct")]
XLABEL = {"closed": "concurrency (closed loop)", "poisson": "offered rate (req/s, Poisson)"}


def ratio(a: Any, b: Any) -> float:
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return float("nan")
    return a / b if math.isfinite(a) and math.isfinite(b) and b != 0 else float("nan")


def pick_baseline(run: RunFiles, requested: str | None) -> tuple[str | None, str]:
    """(baseline engine, a note when the requested one had to be replaced)."""
    engines = run.measured_engines
    if not engines:
        return None, ""
    if requested is None or requested in engines:
        return requested or engines[0], ""
    return engines[0], f"baseline {requested!r} has no results in this run; ratios are to {engines[0]!r}"


def summary_rows(run: RunFiles, baseline: str | None) -> list[dict[str, Any]]:
    """A row per engine and load point, with ratios to the baseline at the same load point;
    a row per engine that was skipped or failed before measuring anything."""
    sweep = run.sweep.to_dict("records")
    base = {(r["load_mode"], r["load_value"]): r for r in sweep if r["engine"] == baseline}
    rows = []
    for e in run.run.get("engines", []):
        mine = [r for r in sweep if r["engine"] == e["name"]]
        for r in mine:
            b = base.get((r["load_mode"], r["load_value"])) if e["name"] != baseline else None
            rows.append({**r, "failed": r["errors"] + r["timeouts"] + r["rejected"],
                         "ratios": {k: ratio(r[k], b[k]) for k, _, _ in COMPARED} if b else None})
        if not mine:
            rows.append({"engine": e["name"], "status": "skipped: " + e["skipped"] if e.get("skipped")
                         else "failed: " + (e.get("failed") or "no load point measured")})
    return rows


def load_series(run: RunFiles, y: str, y2: str | None = None, tag: str = "") -> list[plots.Series]:
    out = []
    for eng in run.measured_engines:
        g = run.sweep[run.sweep["engine"] == eng].sort_values("load_value")
        out.append(plots.Series(eng + tag, g["load_value"].tolist(), g[y].tolist(), g[y2].tolist() if y2 else None))
    return out


def xlabel(run: RunFiles) -> str:
    modes = set(run.sweep["load_mode"])
    return XLABEL.get(modes.pop(), "load") if len(modes) == 1 else "load"


def figures(run: RunFiles) -> list[dict[str, str]]:
    slo = run.run.get("slo") or run.run.get("scenario", {}).get("content", {}).get("slo") or {}
    figs = [
        ("Latency against offered load", plots.latency_vs_load(load_series(run, "mean_ms", "p99_ms"), xlabel(run), slo),
         "Mean (solid) and P99 (dashed) per engine; horizontal lines are the scenario's SLO."),
        ("Latency distribution", plots.latency_cdf(run.requests, slo, run.engines),
         "Empirical CDF of measured (non-warm-up, answered) requests, a line per load point."),
        ("Effective MFU", plots.mfu_vs_load(load_series(run, "mfu"), xlabel(run)),
         "Engines that skip the model (noop) have no MFU and are left out."),
        ("Time per stage", plots.stage_breakdown(stage_times(run.requests)),
         "Mean per-request time of each stage an engine reports (the bounded engine: its DAG nodes)."),
        ("SLO search", plots.slo_probes(run.run.get("slo_search") or {}, slo),
         "Every probe of the max-QPS-under-SLO search."),
    ]
    return [{"title": t, "png": p, "caption": c} for t, p, c in figs if p]


def agreement_rows(run: RunFiles, baseline: str | None) -> list[dict[str, Any]]:
    if baseline not in run.outputs:
        return []
    rows = []
    for eng in run.measured_engines:
        if eng != baseline and eng in run.outputs:
            a = agreement(run.outputs[baseline], run.outputs[eng])
            if a:
                rows.append({"engine": eng, "vs": baseline, **a})
    return rows


def search_rows(run: RunFiles, baseline: str | None) -> list[dict[str, Any]]:
    searches = run.run.get("slo_search") or {}
    base = (searches.get(baseline) or {}).get("max_rate")
    return [{"engine": eng, **s, "ratio": ratio(s.get("max_rate"), base) if eng != baseline else None}
            for eng, s in searches.items()]


def notes(run: RunFiles, baseline_note: str) -> list[str]:
    out = [baseline_note] if baseline_note else []
    if not run.outputs:
        out.append("this run folder has no outputs.jsonl (older runs lack it): no agreement check")
    return out + list(run.run.get("notes") or [])


def run_view(run: RunFiles, baseline: str | None, tag: str = "") -> dict[str, Any]:
    base, note = pick_baseline(run, baseline)
    sc = run.run.get("scenario", {})
    return {"tag": tag, "label": run.label, "path": str(run.path), "run": run.run, "scenario": sc.get("content", {}),
            "scenario_text": sc.get("text", ""), "baseline": base, "rows": summary_rows(run, base),
            "figures": figures(run), "agreement": agreement_rows(run, base), "search": search_rows(run, base),
            "warnings": list(run.run.get("warnings") or []), "notes": notes(run, note)}


def compare_rows(runs: Sequence[RunFiles]) -> list[dict[str, Any]]:
    """Each later run against the first, at the engine and load points both measured."""
    ref = {(r["engine"], r["load_mode"], r["load_value"]): r for r in runs[0].sweep.to_dict("records")}
    rows = []
    for k, run in enumerate(runs[1:], 1):
        for r in run.sweep.to_dict("records"):
            b = ref.get((r["engine"], r["load_mode"], r["load_value"]))
            if b:
                rows.append({"run": k, "engine": r["engine"], "load": f"{r['load_mode']} {r['load_value']:g}",
                             "metrics": [(label, kind, b[key], r[key], ratio(r[key], b[key]) - 1)
                                         for key, label, kind in COMPARED]})
    return rows


def compare_answers(runs: Sequence[RunFiles]) -> list[dict[str, Any]]:
    """The same engine's answers in each later run against the first (did a change alter them?)."""
    rows = []
    for k, run in enumerate(runs[1:], 1):
        for eng, answers in run.outputs.items():
            if eng in runs[0].outputs and (a := agreement(runs[0].outputs[eng], answers)):
                rows.append({"run": k, "engine": eng, **a})
    return rows


def compare_view(runs: Sequence[RunFiles], tags: list[str]) -> dict[str, Any]:
    series = []
    for run, tag in zip(runs, tags):
        series += load_series(run, "mean_ms", "p99_ms", f" ({tag})")
    slo = runs[0].run.get("slo") or {}
    fig = plots.latency_vs_load(series, xlabel(runs[0]), slo)
    goodput = [{"engine": eng, "values": [(r.run.get("slo_search") or {}).get(eng, {}).get("max_rate") for r in runs]}
               for eng in dict.fromkeys(e for r in runs for e in (r.run.get("slo_search") or {}))]
    return {"rows": compare_rows(runs), "answers": compare_answers(runs), "goodput": goodput,
            "figure": fig, "scenarios": [r.run.get("scenario", {}).get("sha256", "") for r in runs]}


def render_report(runs: Sequence[RunFiles], baseline: str | None = None) -> str:
    if not runs:
        raise ValueError("no run to report")
    tags = [chr(ord("A") + i) if len(runs) > 1 else "" for i in range(len(runs))]
    views = [run_view(r, baseline, t) for r, t in zip(runs, tags)]
    return _env().get_template("report.html.j2").render(
        runs=views, compare=compare_view(runs, tags) if len(runs) > 1 else None, compared=COMPARED,
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"))


def build_report(run_dirs: Sequence[str | Path], out: Path, baseline: str | None = None) -> Path:
    """`bench report`: read the run folders, write one page to `out`."""
    runs = [load_run(d) for d in run_dirs]
    if baseline is not None and not any(baseline in r.measured_engines for r in runs):
        known = sorted({e for r in runs for e in r.measured_engines})
        raise ValueError(f"baseline {baseline!r} is not an engine of these runs; engines: {', '.join(known) or 'none'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(runs, baseline))
    return out


def write_report_html(result: Any, out_dir: Path, context: dict) -> Path:
    """The WRITERS entry: rebuilds the page from the files the other writers just wrote."""
    path = out_dir / "report.html"
    path.write_text(render_report([load_run(out_dir)], context.get("baseline")))
    return path


def _env() -> Environment:
    env = Environment(loader=PackageLoader("harness.report", "templates"), autoescape=select_autoescape(["html", "j2"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=fmt, ratio=fmt_ratio, delta=fmt_delta)
    return env


def _finite(v: Any) -> bool:
    try:
        return v is not None and v != "" and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def fmt(v: Any, kind: str = "g") -> str:
    """A number for a table cell: 'ms' one decimal, 'pct' a percentage, 'g' 3-4 significant."""
    if not _finite(v):
        return "–"
    v = float(v)
    if kind == "ms":
        return f"{v:.1f}" if abs(v) >= 1 else f"{v:.3f}"
    if kind == "pct":
        return f"{100 * v:.3g}%"
    return f"{v:.4g}"


def fmt_ratio(v: Any) -> str:
    return f"×{float(v):.3g}" if _finite(v) else "–"


def fmt_delta(v: Any) -> str:
    return f"{100 * float(v):+.1f}%" if _finite(v) else "–"
