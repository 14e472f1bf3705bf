"""report.html from run folders: written by `bench run`, rebuilt and compared by `bench report`."""
import csv
import json
import math
import re
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.report.html import render_report, summary_rows
from harness.report.rundir import load_run, stage_times
from tests.harness.report.conftest import bench_run

IMG = re.compile(r'<img[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _without_timestamp(html: str) -> str:
    return re.sub(r"Generated .*? from", "Generated from", html)


def test_run_writes_a_self_contained_report(prefill_run):
    html = (prefill_run / "report.html").read_text()
    pngs = IMG.findall(html)
    assert len(pngs) >= 3  # latency vs load, CDF, MFU (hf computes; noop has no MFU)
    import base64

    assert all(base64.b64decode(p)[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert not re.search(r'(src|href)="(https?:)?//', html) and "url(" not in html
    assert "default-src 'none'" in html  # the page may not fetch anything
    for text in ('id="summary"', "smoke_prefill", "Peak: <b>0.5 TFLOP/s</b>", "2*N_nonemb", "Agreement with hf",
                 "P99 rests on fewer than 459"):
        assert text in html, text


def test_bench_report_rebuilds_the_same_page_from_the_files(prefill_run, tmp_path):
    out = tmp_path / "again.html"
    res = CliRunner().invoke(app, ["report", str(prefill_run), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert _without_timestamp(out.read_text()) == _without_timestamp((prefill_run / "report.html").read_text())


def test_summary_ratios_are_to_the_baseline_at_the_same_load_point(prefill_run):
    rows = list(csv.DictReader(open(prefill_run / "results.csv")))
    by = {(r["engine"], r["load_value"]): r for r in rows}
    run = load_run(prefill_run)
    for baseline, other in (("hf", "noop"), ("noop", "hf")):
        got = {(r["engine"], f"{r['load_value']:g}"): r for r in summary_rows(run, baseline)}
        for c in ("1", "2"):
            o, b = by[(other, c)], by[(baseline, c)]
            assert got[(other, c)]["ratios"]["qps"] == float(o["qps"]) / float(b["qps"])
            assert got[(other, c)]["ratios"]["mean_ms"] == float(o["mean_ms"]) / float(b["mean_ms"])
            assert got[(baseline, c)]["ratios"] is None


def test_agreement_of_noop_with_hf_from_outputs(prefill_run):
    """noop answers 1/2 for both labels, so the largest difference is max |p_hf - 0.5|."""
    lines = [json.loads(line) for line in open(prefill_run / "outputs.jsonl")]
    hf = [p for line in lines if line["engine"] == "hf" for row in line["scores"] for p in row]
    assert {line["engine"] for line in lines} == {"hf", "noop"}
    assert len([line for line in lines if line["engine"] == "hf"]) == 2 + 4  # warm-up + measured, first point
    expected = max(abs(p - 0.5) for p in hf)
    html = (prefill_run / "report.html").read_text()
    table = html[html.index('class="agreement"'):]
    assert f"<td>{expected:.4g}</td>" in table[: table.index("</table>")]


def test_compare_two_runs_shows_deltas(prefill_run, tmp_path):
    after = tmp_path / "after"
    shutil.copytree(prefill_run, after)
    df = pd.read_csv(after / "results.csv")
    df.loc[df["engine"] == "hf", "mean_ms"] *= 2  # "after" is twice as slow on average
    df.to_csv(after / "results.csv", index=False)
    run = json.loads((after / "run.json").read_text())
    run["run_id"] = "after-change"
    (after / "run.json").write_text(json.dumps(run))
    out = tmp_path / "cmp.html"
    res = CliRunner().invoke(app, ["report", str(prefill_run), str(after), "--out", str(out)])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    table = html[html.index('id="compare"'):]
    table = table[: table.index("</table>")]
    hf_rows = [r for r in table.split("<tr>") if ">hf<" in r]
    assert len(hf_rows) == 2 and all("+100.0%" in r for r in hf_rows)
    assert "after-change" in html and 'id="summary-A"' in html and 'id="summary-B"' in html


def test_report_of_a_folder_that_is_not_a_run(tmp_path):
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "not a run folder" in " ".join(res.output.split())


@pytest.mark.parametrize("name, text, message", [
    ("results.csv", "x,y\n1,2\n", "results.csv: not a results table of `bench run` (no column engine"),
    ("results.csv", "", "results.csv: not a results table of `bench run` (No columns to parse"),
    ("requests.csv", "a,b\n", "requests.csv: not a requests table of `bench run` (no column engine"),
    ("run.json", "[]", "run.json: not what `bench run` writes"),
    ("run.json", '{"engines": [1]}', "run.json: field engines.0: an object expected, got a number"),
])
def test_report_of_a_run_folder_with_a_broken_file(prefill_run, tmp_path, name, text, message):
    broken = tmp_path / "run"
    shutil.copytree(prefill_run, broken)
    (broken / name).write_text(text)
    res = CliRunner().invoke(app, ["report", str(broken), "--out", str(tmp_path / "x.html")])
    assert res.exit_code == 2, res.output  # a KeyError/AttributeError traceback exits 1
    assert message in " ".join(res.output.split()), res.output


def test_unknown_baseline_is_refused_with_the_engines(prefill_run, tmp_path):
    res = CliRunner().invoke(app, ["report", str(prefill_run), "--baseline", "ghost", "--out", str(tmp_path / "x.html")])
    assert res.exit_code == 2 and "ghost" in res.output and "engines: hf, noop" in " ".join(res.output.split())


def test_stage_times_and_their_figure(prefill_run, tmp_path):
    """An engine that reports stages (the bounded engine: DAG nodes) gets a stage figure;
    the means are per stage over measured, answered requests."""
    run = load_run(prefill_run)
    req = run.requests.copy()
    hf = req["engine"] == "hf"
    req.loc[hf, "stages"] = [json.dumps({"tokenize": 1.0 + i, "prefill": 10.0}) for i in range(int(hf.sum()))]
    st = stage_times(req)
    measured = req[hf & ~req["warmup"] & (req["status"] == "ok")]
    first = measured[measured["load_value"] == 1]
    got = st[(st["engine"] == "hf") & (st["load_value"] == 1)].set_index("stage")["ms"]
    expected = sum(json.loads(s)["tokenize"] for s in first["stages"]) / len(first)
    assert got["tokenize"] == expected and got["prefill"] == 10.0
    assert set(st["engine"]) == {"hf"}
    run.requests = req
    html = render_report([run])
    assert "Time per stage" in html and len(IMG.findall(html)) == len(IMG.findall((prefill_run / "report.html").read_text())) + 1


def test_slo_search_rows_and_report(tmp_path, monkeypatch):
    """--find-max-qps with an engine of known service time: probe rows in results.csv, the
    search in run.json, its table and figure in the page."""
    import engines.registry as reg

    monkeypatch.setitem(reg.ENGINES, "slow", "tests.harness.engines_for_tests:SlowEngine")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "scenarios/smoke_prefill.yaml", "--engine", "slow", "--requests", "10",
                                   "--concurrency", "1", "--peak-tflops", "1", "--find-max-qps", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(open(out / "results.csv")))
    probes = [r for r in rows if r["probe"] == "True"]
    assert len(rows) - len(probes) == 1 and 2 <= len(probes) <= 8
    assert all(r["load_mode"] == "poisson" and r["meets_slo"] in ("True", "False") for r in probes)
    search = json.loads((out / "run.json").read_text())["slo_search"]["slow"]
    met = [float(r["load_value"]) for r in probes if r["meets_slo"] == "True"]
    assert search["max_rate"] == pytest.approx(max(met), rel=1e-5)
    # one FIFO server of 20 ms serves 50 req/s; a 10-request probe may briefly go over, not double it
    assert 5 < search["max_rate"] < 100
    html = (out / "report.html").read_text()
    assert 'id="slo-search"' in html and "SLO search probes" not in html  # title is inside the PNG
    assert "max rate under the SLO" in res.output


def test_find_max_qps_says_none_where_no_rate_meets_the_slo(tmp_path, monkeypatch):
    """An engine slower than the SLO's mean alone: the search ends without a rate, and the
    CLI says none (not 'nan req/s'), as the run's warning and run.json do."""
    import engines.registry as reg

    monkeypatch.setitem(reg.ENGINES, "slower", "tests.harness.engines_for_tests:SlowerEngine")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "scenarios/smoke_prefill.yaml", "--engine", "slower", "--requests", "4",
                                   "--concurrency", "1", "--peak-tflops", "1", "--find-max-qps", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "slower: max rate under the SLO: none (" in res.output and "nan req/s" not in res.output
    assert math.isnan(json.loads((out / "run.json").read_text())["slo_search"]["slower"]["max_rate"])


def test_precision_label_beside_agreement():
    from harness.report.html import precision_label

    assert precision_label({"dtype": "bfloat16"}) == "bfloat16"
    assert precision_label({"dtype": "bfloat16", "compute_dtype": "float32"}) == "float32"
    passed = {"summary": "bfloat16 + int8 [down]", "accuracy_gate": {"prefill_only": {"passed": True}}}
    assert precision_label({"dtype": "bfloat16", "precision": passed}) == "bfloat16 + int8 [down]"
    refused = {**passed, "accuracy_gate": {"prefill_only": {"passed": False, "accepted": True}}}
    assert precision_label({"precision": refused}).endswith("(accuracy gate: further from float32 than bf16, accepted)")
    dense = {"summary": "bfloat16", "accuracy_gate": "not needed: no low-precision GEMM group"}
    assert precision_label({"precision": dense}) == "bfloat16"


def test_scenario_table_shows_what_ran_beside_the_file(prefill_run):
    """smoke_prefill asks concurrency [1, 2], 20 requests and 2 warm-ups per point; the run
    had --requests 4: the table says 4 with the file's 20 beside it, and no note where the
    file's values are what ran."""
    from harness.report.scenario_view import load_ran

    view = load_ran(load_run(prefill_run))
    ran = {what: (value, file) for what, value, file in view["ran"]}
    assert ran["concurrency"] == ("1, 2", None)
    assert ran["measured requests per point"] == ("4", "20")
    assert ran["warm-up requests per point"] == ("2", None)
    assert view["differs"]
    html = (prefill_run / "report.html").read_text()
    row = html[html.index('<th class="l">load</th>'):]
    row = " ".join(row[: row.index("</tr>")].split())
    assert "measured requests per point <b>4</b> <span class=\"file\">(file: 20)</span>" in row, row


def test_scenario_table_says_when_the_command_line_switched_the_load_mode():
    from types import SimpleNamespace

    import pandas as pd

    from harness.report.scenario_view import load_ran

    run = SimpleNamespace(run={"scenario": {"content": {"load": {"mode": "closed", "concurrency": [1], "requests": 5}}}},
                          sweep=pd.DataFrame({"load_mode": ["poisson"] * 2, "load_value": [2.0, 8.0],
                                              "status": ["ok"] * 2, "requests": [5, 5]}),
                          requests=pd.DataFrame({"warmup": [], "engine": [], "cell": [], "load_value": []}))
    view = load_ran(run)
    assert view["ran"][0] == ("mode", "Poisson arrivals", "closed loop") and view["differs"]
    assert view["ran"][1] == ("rate", "2, 8", None)


def _figures(monkeypatch, run):
    """Every matplotlib Figure the report of `run` draws."""
    from harness.report import plots

    drawn = []
    real = plots.png
    monkeypatch.setattr(plots, "png", lambda fig: (drawn.append(fig), real(fig))[1])
    render_report([run])
    return drawn


def test_one_load_point_is_drawn_as_bars(prefill_run, monkeypatch):
    """With one concurrency level, latency and MFU are bars per engine, not lone dots."""
    from matplotlib.lines import Line2D

    run = load_run(prefill_run)
    run.results = run.results[run.results["load_value"] == 1]
    figs = {f.axes[0].get_title(): f for f in _figures(monkeypatch, run)}
    for title in ("Latency at concurrency (closed loop) 1: mean (filled), P99 (hatched)",
                  "Effective MFU at concurrency (closed loop) 1"):
        ax = figs[title].axes[0]
        assert len(ax.patches) >= 1, title  # bars (noop has no MFU: one bar there)
        lone = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 1 and ln.get_marker() not in (None, "None", "")]
        assert not lone, title
    # two load points: lines again
    lines = {f.axes[0].get_title() for f in _figures(monkeypatch, load_run(prefill_run))}
    assert "Latency against offered load" in lines and "Effective MFU" in lines


def _overlaps(fig) -> list[str]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    found = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels]
            for k, (a, ba) in enumerate(boxes):
                found += [f"{ax.get_title()}: {a!r} / {b!r}" for b, bb in boxes[k + 1:] if ba.overlaps(bb)]
    return found


def test_tick_labels_do_not_overlap(prefill_run, monkeypatch):
    """A latency CDF whose x axis spans a few decades on a narrow panel labelled minor ticks
    on top of each other; no figure of the report may have overlapping tick labels."""
    run = load_run(prefill_run)
    req = run.requests.copy()
    hf = (req["engine"] == "hf").to_numpy()
    req.loc[hf, "latency_ms"] = [150.0 + 50 * (i % 11) for i in range(int(hf.sum()))]  # 150 .. 650 ms
    run.requests = req
    run.run["slo"] = {"mean_ms": 20.0, "p99_ms": 70.0}  # with the SLO: a log axis over 1.5 decades
    figs = _figures(monkeypatch, run)
    assert len(figs) >= 3
    for fig in figs:
        assert not _overlaps(fig), _overlaps(fig)


def test_sglang_on_a_cpu_is_noted(prefill_run):
    """SGLang measured on a CPU runs torch_native attention (its CPU kernels are not on the
    registry): the report says so; not for `bench serve` behind the sglang client, nor a GPU."""
    from harness.report.html import engine_notes

    run = load_run(prefill_run)
    cpu = {"name": "sglang", "device": "cpu", "server_settings": {"device": "cpu", "attention_backend": "torch_native"}}
    gpu = {"name": "sglang", "device": "cuda", "server_settings": {"device": "cuda", "attention_backend": "fa3"}}
    served = {**cpu, "served_engine": {"name": "hf"}}
    run.run["engines"] = [{"name": "sglang", "describe": cpu}, {"name": "sglang-gpu", "describe": gpu},
                          {"name": "sglang-served", "describe": served}]
    said = engine_notes(run)
    assert len(said) == 1 and said[0].startswith("sglang ran on a CPU with SGLang's torch_native attention")
    assert "torch_native attention" in render_report([run])


def test_a_profile_left_in_the_run_folder_is_in_its_report(prefill_run, tmp_path):
    import shutil

    from harness.run.profile import ClassRow, Profile, write

    run = tmp_path / "run"
    shutil.copytree(prefill_run, run)
    p = Profile("smoke_prefill", "bounded", "cpu", 3, 4.0,
                [ClassRow("gemm", 1.5, 0.375, "0.10 GFLOP", "67 GFLOP/s", 0.5), ClassRow("host", 2.5, 0.625),
                 ClassRow("host: check + tokenize", 2.5, 0.625)])
    write(p, run)
    page = render_report([load_run(run)])
    assert "Where a request" in page and "0.10 GFLOP" in page and "host: check + tokenize" in page
    (run / "profile.json").write_text('{"request_ms": 4.0, "classes": "gemm"}')
    with pytest.raises(ValueError, match="profile.json: field classes"):
        load_run(run) and render_report([load_run(run)])
