"""`bench load`: Locust headless (master + 2 workers) against `bench serve`, and the mapping of
Locust's CSVs to results.csv checked on hand-written stats."""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.load.locust import LoadSpec, locust_commands, locust_row, outcome, parse_duration
from harness.report.tables import RESULT_COLUMNS
from harness.load.process import ServeProcess

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"
needs_locust = pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust not installed")

STATS = """Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,Min Response Time,Max Response Time,Average Content Size,Requests/s,Failures/s,50%,66%,75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%
POST,/v1/score,90,0,12,13.5,5.1,80.2,300,9.0,0.0,12,13,14,15,20,30,60,75,80,80,80
POST,/v1/score failed,10,10,2,2.5,1.0,9.0,120,1.0,1.0,2,2,3,3,4,5,9,9,9,9,9
,Aggregated,100,10,11,12.4,1.0,80.2,282,10.0,1.0,11,12,13,14,19,29,59,74,80,80,80
"""
FAILURES = """Method,Name,Error,Occurrences
POST,/v1/score failed,CatchResponseError('rejected: HTTP 429'),7
POST,/v1/score failed,CatchResponseError('error: HTTP 500'),2
POST,/v1/score failed,CatchResponseError('timeout: ConnectionTimeout'),1
"""


def test_locust_row_from_hand_written_stats(tmp_path):
    (tmp_path / "locust_stats.csv").write_text(STATS)
    (tmp_path / "locust_failures.csv").write_text(FAILURES)
    pool = {"samples_per_request": 4.0, "tokens_per_request": 100.0}
    row = locust_row(tmp_path / "locust", "sc", "http x", 8, pool)
    assert set(row) <= set(RESULT_COLUMNS)
    assert (row["requests"], row["ok"], row["rejected"], row["errors"], row["timeouts"]) == (100, 90, 7, 2, 1)
    # latency over the successful row only; window = 100 requests / 10 req/s
    assert (row["mean_ms"], row["p50_ms"], row["p90_ms"], row["p99_ms"], row["max_ms"]) == (13.5, 12, 20, 75, 80.2)
    assert row["window_s"] == pytest.approx(10.0)
    assert row["qps"] == pytest.approx(9.0) and row["samples_per_s"] == pytest.approx(36.0)
    assert row["tokens_per_s"] == pytest.approx(900.0) and row["p99_estimate"] is True
    assert row["load_mode"] == "locust" and row["load_value"] == 8


def test_outcome_categories():
    item = {"route": "/v1/score", "items": 2, "labels": 2}
    good = json.dumps({"scores": [[0.5, 0.5], [0.1, 0.9]]})
    assert outcome(200, None, good, item) is None
    assert outcome(429, None, "", item) == "rejected: HTTP 429"
    assert outcome(503, None, "", item) == "error: HTTP 503"
    assert outcome(0, TimeoutError("timed out"), "", item).startswith("timeout:")
    assert outcome(0, ConnectionRefusedError(), "", item).startswith("error:")
    assert outcome(200, None, json.dumps({"scores": [[1.0, 0.0]]}), item).startswith("error: bad answer")
    beams = {"route": "/generate", "beams": 2}
    two = {"text": "", "output_ids": [1], "meta_info": {"beam_results": [
        {"output_ids": [1], "text": "", "meta_info": {"sequence_score": -1.0}},
        {"output_ids": [2], "text": "", "meta_info": {"sequence_score": -2.0}}]}}
    assert outcome(200, None, json.dumps(two), beams) is None
    two["meta_info"]["beam_results"].pop()
    assert outcome(200, None, json.dumps(two), beams) == "error: wrong number of beams"


def test_parse_duration_and_commands(tmp_path):
    assert [parse_duration(t) for t in ("90", "90s", "2m", "1h30m", "1.5")] == [90, 90, 120, 5400, 1.5]
    with pytest.raises(ValueError):
        parse_duration("soon")
    cmds = locust_commands(LoadSpec("http://127.0.0.1:1", 4, 2, 10, workers=2), tmp_path / "l")
    assert len(cmds) == 3 and "--master" in cmds[0] and all("--worker" in c for c in cmds[1:])
    port = cmds[0][cmds[0].index("--master-bind-port") + 1]
    assert all(c[c.index("--master-port") + 1] == port for c in cmds[1:])
    assert cmds[0][cmds[0].index("--master-bind-host") + 1] == "127.0.0.1"
    assert "--master" not in locust_commands(LoadSpec("http://h", 1, 1, 1), tmp_path / "l")[0]


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 100_000}, "--workers 100000: at most"),  # was: 100,000 local processes started
    ({"spawn_rate": float("inf")}, "finite spawn rate"),
    ({"spawn_rate": float("nan")}, "spawn rate"),
    ({"run_time_s": 1e12}, "(a week)"),
    ({"users": 10**9}, "users <= 10,000"),
    ({"host": "notaurl"}, "--host 'notaurl': give the server's URL"),
    ({"host": "ftp://127.0.0.1:1"}, "give the server's URL"),
])
def test_load_spec_refuses_what_cannot_run(kwargs, message):
    args = {"host": "http://127.0.0.1:1", "users": 4, "spawn_rate": 2.0, "run_time_s": 10.0, **kwargs}
    with pytest.raises(ValueError) as e:
        LoadSpec(**args)
    assert message in str(e.value)


@needs_locust
def test_load_that_gets_no_answer_exits_3(tmp_path, tiny_dir):
    import socket

    with socket.socket() as s:  # nothing listens on this port once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = CliRunner().invoke(app, ["load", str(SCENARIOS / "smoke_prefill.yaml"), "--host", f"http://127.0.0.1:{port}",
                                   "--users", "1", "--run-time", "2s", "--pool", "4", "--out", str(tmp_path / "l")])
    assert res.exit_code == 3, res.output
    assert "not measured: no request to" in " ".join(res.output.split())
    rows = list(csv.DictReader(open(tmp_path / "l" / "results.csv")))
    assert rows[0]["ok"] == "0" and int(rows[0]["errors"]) > 0  # what happened is still written


@needs_locust
def test_locust_master_and_two_workers_against_bench_serve(tmp_path, tiny_dir):
    scenario = SCENARIOS / "smoke_prefill.yaml"
    out = tmp_path / "load"
    with ServeProcess(scenario, "hf") as serve:
        res = CliRunner().invoke(app, ["load", str(scenario), "--host", serve.url, "--users", "4",
                                       "--spawn-rate", "4", "--run-time", "10s", "--workers", "2",
                                       "--pool", "40", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 1 and list(rows[0]) == RESULT_COLUMNS
    row = rows[0]
    assert row["engine"] == f"http {serve.url}" and row["load_mode"] == "locust" and row["load_value"] == "4"
    assert int(row["ok"]) > 0 and int(row["ok"]) == int(row["requests"])
    assert float(row["qps"]) > 0 and 0 < float(row["p50_ms"]) <= float(row["max_ms"])
    run = json.loads((out / "run.json").read_text())
    assert run["load"]["workers"] == 2 and run["locust_version"] and run["results"][0]["ok"] == int(row["ok"])
    assert run["scenario"]["content"]["name"] == "smoke_prefill"
    assert (out / "locust-worker-1.log").exists() and (out / "locust-worker-2.log").exists()
