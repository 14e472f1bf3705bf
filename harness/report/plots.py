"""The report's figures, drawn with matplotlib's Agg backend (no display, no pyplot state)
and returned as base64 PNG so the page embeds them. Each function returns None when it has
nothing to draw."""
from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

DPI = 80
SLO_STYLE = {"mean_ms": dict(color="0.35", ls=":", lw=1.2), "p99_ms": dict(color="tab:red", ls="-.", lw=1.2)}


@dataclass
class Series:
    label: str
    x: Sequence[float]
    y: Sequence[float]
    y2: Sequence[float] | None = None  # a second line in the same colour (P99 beside the mean)


def png(fig: Figure) -> str:
    for ax in fig.axes:
        _tidy_ticks(ax)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _slo_lines(ax, slo: dict, horizontal: bool = True) -> None:
    for key, label in (("mean_ms", "SLO mean"), ("p99_ms", "SLO P99")):
        v = (slo or {}).get(key)
        if v:
            (ax.axhline if horizontal else ax.axvline)(v, label=f"{label} {v:g} ms", **SLO_STYLE[key])


def _tidy_ticks(ax) -> None:
    """Log axes with few enough tick labels that they never overlap, even on a narrow panel
    (matplotlib labels minor ticks over a short log range, on top of each other): 1, 2, 5 of
    each decade over a short range, the decades alone over a long one. Linear axes keep
    matplotlib's own choice, which sizes the ticks to the panel."""
    for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
        if scale == "log":
            axis.set_minor_formatter(NullFormatter())
            if isinstance(axis.get_major_locator(), LogLocator):  # not a swept parameter's own values
                lo, hi = sorted(axis.get_view_interval())
                few = lo > 0 and math.log10(hi / lo) < 2.5  # 1, 2, 5 per decade, written as plain numbers
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if few else (1.0,), numticks=8))
                if few:
                    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def single_point(series: list[Series]) -> float | None:
    """The one load point every series has, when there is only one (lines would be lone dots)."""
    xs = {float(x) for s in series for x in s.x}
    return xs.pop() if len(xs) == 1 else None


def _bars(ax, labels: list[str], groups: list[tuple[str, list[float], dict]]) -> None:
    """Grouped bars: a group per label (engine), a bar per (name, values, style) in `groups`,
    each bar's value written above it."""
    n = len(labels)
    ax.figure.set_size_inches(min(14.0, max(7.0, 0.7 * n * len(groups) + 2)), ax.figure.get_size_inches()[1])
    width = 0.8 / len(groups)
    at = np.arange(n)
    for k, (name, values, style) in enumerate(groups):
        bars = ax.bar(at + (k - (len(groups) - 1) / 2) * width, values, width, label=name, **style)
        if n * len(groups) <= 16:  # beyond that the values crowd each other: the table has them
            ax.bar_label(bars, labels=[f"{v:.3g}" if math.isfinite(v) else "" for v in values], fontsize=7,
                         padding=2)
    ax.set_xticks(at, labels, rotation=30 if n > 4 else 0, ha="right" if n > 4 else "center",
                  rotation_mode="anchor")


def _log_if_wide(ax, values, axis: str = "y") -> None:
    v = np.asarray([x for x in values if x and math.isfinite(x) and x > 0])
    if v.size and v.max() / v.min() > 30:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def latency_vs_load(series: list[Series], xlabel: str, slo: dict) -> str | None:
    """Mean (solid) and P99 (dashed) latency against offered load, one colour per series."""
    series = [s for s in series if len(s.x)]
    if not series:
        return None
    fig = Figure(layout="constrained", figsize=(7, 4))
    ax = fig.subplots()
    at = single_point(series)
    if at is not None:  # one load point: bars per engine, not lone dots on an empty axis
        groups = [("mean", [float(s.y[0]) for s in series], dict(color=[f"C{i % 10}" for i in range(len(series))]))]
        if any(s.y2 is not None for s in series):
            groups.append(("P99", [float(s.y2[0]) if s.y2 is not None else float("nan") for s in series],
                           dict(color="none", edgecolor=[f"C{i % 10}" for i in range(len(series))], hatch="//")))
        _bars(ax, [s.label for s in series], groups)
        _slo_lines(ax, slo)
        _log_if_wide(ax, [v for _, vs, _ in groups for v in vs] + list((slo or {}).values()))
        ax.set(ylabel="latency (ms)", title=f"Latency at {xlabel} {at:g}: mean (filled), P99 (hatched)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        return png(fig)
    for i, s in enumerate(series):
        c = f"C{i % 10}"
        ax.plot(s.x, s.y, "o-", color=c, label=f"{s.label} mean")
        if s.y2 is not None:
            ax.plot(s.x, s.y2, "s--", color=c, label=f"{s.label} P99")
    _slo_lines(ax, slo)
    _log_if_wide(ax, [v for s in series for v in list(s.y) + list(s.y2 or [])] + list((slo or {}).values()))
    ax.set(xlabel=xlabel, ylabel="latency (ms)", title="Latency against offered load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return png(fig)


def latency_cdf(requests: pd.DataFrame, slo: dict, engines: Sequence[str]) -> str | None:
    """Empirical CDF of measured latencies, a panel per engine, a line per load point."""
    ok = requests[(~requests["warmup"]) & (requests["status"] == "ok")]
    engines = [e for e in engines if (ok["engine"] == e).any()]
    if not engines:
        return None
    cols = min(3, len(engines))
    rows = math.ceil(len(engines) / cols)
    fig = Figure(layout="constrained", figsize=(4.2 * cols, 3.2 * rows))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, eng in zip(axes, engines):
        mine = ok[ok["engine"] == eng]
        keys = ["cell", "load_mode", "load_value"] if "cell" in mine else ["load_mode", "load_value"]
        for key, g in mine.groupby(keys, sort=False):
            cell, mode, value = key if len(key) == 3 else ("", *key)
            lat = np.sort(g["latency_ms"].to_numpy(float))
            ax.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post",
                    label=f"{cell + ' · ' if cell else ''}{mode} {value:g}")
        _slo_lines(ax, slo, horizontal=False)
        _log_if_wide(ax, mine["latency_ms"].tolist() + list((slo or {}).values()), axis="x")
        ax.set(title=eng, xlabel="latency (ms)", ylabel="fraction of requests", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[len(engines):]:
        ax.set_visible(False)
    fig.suptitle("Latency distribution (measured requests)")
    return png(fig)


def mfu_vs_load(series: list[Series], xlabel: str) -> str | None:
    series = [s for s in series if any(math.isfinite(v) for v in s.y)]
    if not series:
        return None
    fig = Figure(layout="constrained", figsize=(7, 3.6))
    ax = fig.subplots()
    at = single_point(series)
    if at is not None:  # one load point: a bar per engine
        _bars(ax, [s.label for s in series], [("effective MFU", [100 * float(s.y[0]) for s in series],
                                               dict(color=[f"C{i % 10}" for i in range(len(series))]))])
        ax.set(ylabel="effective MFU (%)", title=f"Effective MFU at {xlabel} {at:g}", ylim=(0, None))
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
        return png(fig)
    for i, s in enumerate(series):
        ax.plot(s.x, [100 * v for v in s.y], "o-", color=f"C{i % 10}", label=s.label)
    ax.set(xlabel=xlabel, ylabel="effective MFU (%)", title="Effective MFU", ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png(fig)


def stage_breakdown(stages: pd.DataFrame) -> str | None:
    """Stacked bars of mean time per stage, a bar per engine and load point."""
    if stages.empty:
        return None
    cell = stages["cell"].map(lambda c: f" ({c})" if c else "") if "cell" in stages else ""
    stages = stages.assign(bar=stages["engine"] + cell + " @ " + stages["load_mode"] + " "
                           + stages["load_value"].map(lambda v: f"{v:g}"))
    table = stages.pivot_table(index="bar", columns="stage", values="ms", sort=False).fillna(0.0)
    fig = Figure(layout="constrained", figsize=(7, 0.5 * len(table) + 1.6))
    ax = fig.subplots()
    left = np.zeros(len(table))
    for i, stage in enumerate(table.columns):
        ax.barh(table.index, table[stage], left=left, color=f"C{i % 10}", label=stage)
        left += table[stage].to_numpy()
    ax.invert_yaxis()
    ax.set(xlabel="mean time per request (ms)", title="Time per stage (as reported by each engine)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(4, len(table.columns)), loc="upper center", bbox_to_anchor=(0.5, -0.18))
    return png(fig)


def slo_probes(searches: dict[str, dict], slo: dict) -> str | None:
    """Each SLO-search probe: mean and P99 against rate; filled where the probe met the SLO,
    hollow where it missed; a vertical line at each engine's max rate."""
    if not any(s.get("probes") for s in searches.values()):
        return None
    fig = Figure(layout="constrained", figsize=(7, 4))
    ax = fig.subplots()
    for i, (eng, s) in enumerate(searches.items()):
        c = f"C{i % 10}"
        probes = sorted(s["probes"], key=lambda p: p["rate"])
        for key, marker in (("mean_ms", "o"), ("p99_ms", "s")):
            for p in probes:
                ax.plot(p["rate"], p[key], marker, color=c, mfc=c if p["meets"] else "none")
            ax.plot([p["rate"] for p in probes], [p[key] for p in probes], "-" if key == "mean_ms" else "--",
                    color=c, alpha=0.5, label=f"{eng} {'mean' if key == 'mean_ms' else 'P99'}")
        if s.get("max_rate") and math.isfinite(s["max_rate"]):
            ax.axvline(s["max_rate"], color=c, lw=2, alpha=0.4, label=f"{eng} max {s['max_rate']:.3g} req/s")
    _slo_lines(ax, slo)
    ax.set(xlabel="Poisson rate (req/s)", ylabel="latency (ms)",
           title="SLO search probes (filled: met the SLO, hollow: missed)")
    _log_if_wide(ax, [p[k] for s in searches.values() for p in s["probes"] for k in ("mean_ms", "p99_ms")])
    _log_if_wide(ax, [p["rate"] for s in searches.values() for p in s["probes"]], axis="x")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return png(fig)


@dataclass
class Failed:
    """A failed sweep cell, marked at its parameter value on every figure against it."""

    series: int  # index of the series it belongs to (its colour)
    x: float


def against_param(series: list[Series], failed: Sequence[Failed], xlabel: str, ylabel: str, title: str,
                  slo: dict | None = None, percent: bool = False) -> str | None:
    """One line per series against a swept parameter (y2 dashed, e.g. P99 beside the mean);
    failed cells as crosses on the x axis in their series' colour."""
    if not any(any(math.isfinite(v) for v in s.y) for s in series) and not failed:
        return None
    fig = Figure(layout="constrained", figsize=(7, 4))
    ax = fig.subplots()
    scale = 100.0 if percent else 1.0
    for i, s in enumerate(series):
        c = f"C{i % 10}"
        ax.plot(s.x, [scale * v for v in s.y], "o-", color=c, label=s.label)
        if s.y2 is not None:
            ax.plot(s.x, [scale * v for v in s.y2], "s--", color=c, label=f"{s.label} P99")
    stacked: dict[float, int] = {}  # failed cells at one x stack upwards, so each shows
    for k, f in enumerate(failed):
        level = stacked[f.x] = stacked.get(f.x, -1) + 1
        ax.plot(f.x, 0.05 + 0.07 * level, "X", ms=11, color=f"C{f.series % 10}", mec="tab:red", mew=1.5,
                transform=ax.get_xaxis_transform(), clip_on=False,
                label="failed cell (its line's colour)" if k == 0 else None)
    if slo:
        _slo_lines(ax, slo)
    if not percent:
        ys = [v for s in series for v in list(s.y) + list(s.y2 or [])]
        _log_if_wide(ax, ys + (list(slo.values()) if slo else []))
    xs = sorted({float(x) for s in series for x in s.x} | {f.x for f in failed})
    _log_if_wide(ax, xs, axis="x")
    if len(xs) <= 12:  # the swept values themselves, as plain numbers
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if percent:
        top = max([scale * v for s in series for v in s.y if v == v], default=0.0)
        ax.set_ylim(0, max(105.0, 1.05 * top))  # over 100 % (a peak set too low) still shows
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return png(fig)
