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

from engines.base import Description
from harness.measure.agreement import agreement
from harness.report import plots
from harness.report.formats import finite, fmt, fmt_delta, fmt_ratio
from harness.report.rundir import RunFiles, load_run, read_profile, stage_times
from harness.report.scenario_view import load_ran

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


def _key(r: dict[str, Any]) -> tuple:
    return r.get("cell", ""), r["load_mode"], r["load_value"]


def summary_rows(run: RunFiles, baseline: str | None) -> list[dict[str, Any]]:
    """A row per engine, cell and load point, with ratios to the baseline at the same cell and
    load point (failed rows have none); a row per engine that was skipped or failed before
    measuring anything."""
    sweep = run.sweep.to_dict("records")
    base = {_key(r): r for r in sweep if r["engine"] == baseline and r.get("status", "ok") == "ok"}
    rows = []
    for e in run.run.get("engines", []):
        mine = [r for r in sweep if r["engine"] == e["name"]]
        for r in mine:
            b = base.get(_key(r)) if e["name"] != baseline and r.get("status", "ok") == "ok" else None
            rows.append({**r, "failed": r["errors"] + r["timeouts"] + r["rejected"],
                         "ratios": {k: ratio(r[k], b[k]) for k, _, _ in COMPARED} if b else None})
        if not mine:
            rows.append({"engine": e["name"], "skip": ("skipped (optional): " if e.get("optional") else "skipped: ") + e["skipped"]
                         if e.get("skipped")
                         else "failed: " + (e.get("failed") or "no load point measured")})
    return rows


def load_series(run: RunFiles, y: str, y2: str | None = None, tag: str = "") -> list[plots.Series]:
    """A line against load per engine (and cell), over the points that did not fail."""
    out = []
    sweep = run.sweep[run.sweep["status"] == "ok"]
    for eng in run.measured_engines:
        mine = sweep[sweep["engine"] == eng]
        for cell, g in mine.groupby("cell", sort=False):
            g = g.sort_values("load_value")
            label = eng + (f" ({cell})" if cell else "") + tag
            out.append(plots.Series(label, g["load_value"].tolist(), g[y].tolist(), g[y2].tolist() if y2 else None))
    return out


def param_series(run: RunFiles, y: str, y2: str | None = None) -> tuple[list[plots.Series], list[plots.Failed]]:
    """Lines against the first swept parameter: one per engine, load point and value of the
    other swept parameters; the failed cells of each line, to mark."""
    x, others = run.swept[0], run.swept[1:]
    series, failed = [], []
    for key, g in run.sweep.groupby(["engine", "load_mode", "load_value", *others], sort=False):
        eng, mode, value, *rest = key
        label = f"{eng} @ {mode} {value:g}" + "".join(f", {k}={v:g}" for k, v in zip(others, rest))
        g = g.sort_values(x)
        ok = g[g["status"] == "ok"]
        failed += [plots.Failed(len(series), float(v)) for v in g.loc[g["status"] != "ok", x]]
        series.append(plots.Series(label, ok[x].tolist(), ok[y].tolist(), ok[y2].tolist() if y2 else None))
    return series, failed


def param_figures(run: RunFiles, slo: dict) -> list[tuple[str, str | None, str]]:
    """The figures against the swept parameter (a sweep run only)."""
    x = run.swept[0]
    beam = run.sweep["beams_per_s"].notna().any() if "beams_per_s" in run.sweep else False
    thr, thr_label = ("beams_per_s", "beams/s") if beam else ("items_per_s", "items/s")
    if thr not in run.sweep or not run.sweep[thr].notna().any():
        thr, thr_label = "samples_per_s", "samples/s"
    note = " Crosses on the x axis: failed cells (see the summary for why)."
    figs = [
        (f"Latency against {x}", plots.against_param(*param_series(run, "mean_ms", "p99_ms"), x, "latency (ms)",
                                                      f"Latency against {x}", slo),
         "Mean (solid) and P99 (dashed) per engine and load point; horizontal lines are the SLO." + note),
        (f"Throughput against {x}", plots.against_param(*param_series(run, thr), x, thr_label,
                                                         f"{thr_label} against {x}"),
         ("Beams/s = W x requests/s." if beam else "Items (samples) scored per second.") + note),
        (f"Requests/s against {x}", plots.against_param(*param_series(run, "qps"), x, "requests/s",
                                                         f"Requests/s against {x}"), note.strip()),
        (f"Effective MFU against {x}", plots.against_param(*_computing(param_series(run, "mfu")), x,
                                                            "effective MFU (%)", f"Effective MFU against {x}",
                                                            percent=True), note.strip()),
    ]
    if "valid_code_rate" in run.sweep and run.sweep["valid_code_rate"].notna().any():
        figs.append((f"Valid-code rate against {x}", plots.against_param(
            *param_series(run, "valid_code_rate"), x, "beams that are item codes (%)",
            f"Valid-code rate against {x}", percent=True),
            "Share of each engine's returned beams that are real item codes." + note))
    figs.append((f"Max rate under the SLO against {x}", plots.against_param(
        *search_series(run), x, "max rate under the SLO (req/s)", f"Max rate under the SLO against {x}"),
        "Highest Poisson rate meeting the SLO per cell (--find-max-qps); crosses: no rate met it."))
    return figs


def _computing(pair):
    series, failed = pair
    keep = [i for i, s in enumerate(series) if any(v == v for v in s.y)]
    return [series[i] for i in keep], [plots.Failed(keep.index(f.series), f.x) for f in failed if f.series in keep]


def search_series(run: RunFiles) -> tuple[list[plots.Series], list[plots.Failed]]:
    x = run.swept[0]
    by_engine: dict[str, list[dict]] = {}
    for s in run.searches:
        if x in (s.get("params") or {}):
            by_engine.setdefault(s["engine"], []).append(s)
    series, failed = [], []
    for eng, ss in by_engine.items():
        ss = sorted(ss, key=lambda s: s["params"][x])
        met = [s for s in ss if finite(s.get("max_rate"))]
        failed += [plots.Failed(len(series), s["params"][x]) for s in ss if not finite(s.get("max_rate"))]
        series.append(plots.Series(eng, [s["params"][x] for s in met], [s["max_rate"] for s in met]))
    return series, failed


def xlabel(run: RunFiles) -> str:
    modes = set(run.sweep["load_mode"])
    return XLABEL.get(modes.pop(), "load") if len(modes) == 1 else "load"


def figures(run: RunFiles) -> list[dict[str, str]]:
    slo = run.run.get("slo") or run.run.get("scenario", {}).get("content", {}).get("slo") or {}
    figs = param_figures(run, slo) if run.swept else []
    latency = load_series(run, "mean_ms", "p99_ms")
    one = plots.single_point(latency) is not None  # one load point: bars, not lone dots
    figs += [
        ("Latency against offered load", plots.latency_vs_load(latency, xlabel(run), slo),
         ("Mean (filled) and P99 (hatched) per engine at the run's one load point"
          if one else "Mean (solid) and P99 (dashed) per engine") + "; horizontal lines are the scenario's SLO."),
        ("Latency distribution", plots.latency_cdf(run.requests, slo, run.engines),
         "Empirical CDF of measured (non-warm-up, answered) requests, a line per load point."),
        ("Effective MFU", plots.mfu_vs_load(load_series(run, "mfu"), xlabel(run)),
         "Engines that skip the model (noop) have no MFU and are left out."),
        ("Time per stage", plots.stage_breakdown(stage_times(run.requests)),
         "Mean per-request time of each stage an engine reports (the bounded engine: its DAG nodes)."),
        ("SLO search", plots.slo_probes({s["engine"] + (f" ({s['cell']})" if s.get("cell") else ""): s
                                         for s in run.searches}, slo),
         "Every probe of the max-QPS-under-SLO search."),
    ]
    return [{"title": t, "png": p, "caption": c} for t, p, c in figs if p]


def precision_label(describe: dict[str, Any]) -> str:
    """An engine's precision in a few words, from the description run.json recorded."""
    return Description.from_dict(describe).precision.label


def precisions(run: RunFiles) -> dict[str, str]:
    return {e["name"]: precision_label(e.get("describe") or {}) for e in run.run.get("engines", [])}


def agreement_rows(run: RunFiles, baseline: str | None) -> list[dict[str, Any]]:
    if baseline not in run.outputs:
        return []
    rows, prec = [], precisions(run)
    for eng in run.measured_engines:
        if eng != baseline and eng in run.outputs:
            a = agreement(run.outputs[baseline], run.outputs[eng])
            if a:
                rows.append({"engine": eng, "vs": baseline, "precision": prec.get(eng, "?"), **a})
    return rows


def peak_view(peak: dict[str, Any]) -> dict[str, Any]:
    """The peak used and why, and every rate per precision (older run.json files hold only
    the denominator and its source)."""
    rates = peak.get("rates_tflops") or {}
    return {"tflops": peak.get("tflops"), "why": peak.get("why") or peak.get("source", ""),
            "rates": [{"precision": p, "tflops": r, "unit": "TOP/s" if p == "int8" else "TFLOP/s",
                       "used": p == peak.get("precision") and "command line" not in (peak.get("why") or "")}
                      for p, r in rates.items()],
            "capabilities": peak.get("capabilities") or {}}


def search_rows(run: RunFiles, baseline: str | None) -> list[dict[str, Any]]:
    base = {s.get("cell", ""): s.get("max_rate") for s in run.searches if s["engine"] == baseline}
    return [{**s, "ratio": ratio(s.get("max_rate"), base.get(s.get("cell", ""))) if s["engine"] != baseline else None}
            for s in run.searches]


SGLANG_ON_CPU = ("{engine} ran on a CPU with SGLang's torch_native attention: SGLang's own CPU kernels "
                 "(sgl-kernel's CPU build, intel_amx attention) are source builds not on the package registry, "
                 "so these are not SGLang's best CPU figures")


def engine_notes(run: RunFiles) -> list[str]:
    """What a reader must know to compare an engine fairly: SGLang on a CPU runs its
    torch_native attention, not its own CPU kernels."""
    out = []
    for e in run.run.get("engines", []):
        d = e.get("describe") or {}
        settings = d.get("server_settings") if isinstance(d.get("server_settings"), dict) else {}
        real = d.get("name") == "sglang" and "served_engine" not in d  # not `bench serve` behind the sglang client
        on_cpu = settings.get("device") == "cpu" or settings.get("attention_backend") == "torch_native" or (
            not settings and d.get("device") == "cpu")
        if real and on_cpu and not e.get("skipped"):
            out.append(SGLANG_ON_CPU.format(engine=e["name"]))
    return out


def notes(run: RunFiles, baseline_note: str) -> list[str]:
    out = [baseline_note] if baseline_note else []
    out += engine_notes(run)
    if not run.outputs:
        out.append("this run folder has no outputs.jsonl (older runs lack it): no agreement check")
    return out + list(run.run.get("notes") or [])


def run_view(run: RunFiles, baseline: str | None, tag: str = "") -> dict[str, Any]:
    base, note = pick_baseline(run, baseline)
    sc = run.run.get("scenario", {})
    has = lambda c: c in run.sweep and bool(run.sweep[c].notna().any())  # noqa: E731
    return {"tag": tag, "label": run.label, "path": str(run.path), "run": run.run, "scenario": sc.get("content", {}),
            "load": load_ran(run),
            "swept": run.swept, "beam": has("beams_per_s"), "codes": has("valid_code_rate"),
            "failed_cells": int((run.sweep["status"] == "failed").sum()),
            "scenario_text": sc.get("text", ""), "baseline": base, "rows": summary_rows(run, base),
            "figures": figures(run), "agreement": agreement_rows(run, base),
            "baseline_precision": precisions(run).get(base, "?"), "peak": peak_view(run.run.get("peak") or {}), "search": search_rows(run, base),
            "warnings": list(run.run.get("warnings") or []), "notes": notes(run, note),
            "profile": read_profile(run.path)}


def compare_rows(runs: Sequence[RunFiles]) -> list[dict[str, Any]]:
    """Each later run against the first, at the engine and load points both measured."""
    ref = {(r["engine"], *_key(r)): r for r in runs[0].sweep.to_dict("records")}
    rows = []
    for k, run in enumerate(runs[1:], 1):
        for r in run.sweep.to_dict("records"):
            b = ref.get((r["engine"], *_key(r)))
            if b:
                cell = f"{r['cell']} · " if r.get("cell") else ""
                rows.append({"run": k, "engine": r["engine"], "load": f"{cell}{r['load_mode']} {r['load_value']:g}",
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
    def key(s):
        return s["engine"] + (f" ({s['cell']})" if s.get("cell") else "")

    rates = [{key(s): s.get("max_rate") for s in r.searches} for r in runs]
    goodput = [{"engine": k, "values": [rt.get(k) for rt in rates]} for k in dict.fromkeys(k for rt in rates for k in rt)]
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
