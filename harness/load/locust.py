"""`bench load`: Locust, headless, against an SGLang-compatible server (`bench serve` or a real
SGLang), its CSV stats turned into the harness's results.csv and run.json.

The scenario's requests are tokenized here once and written as the bodies the `sglang`
engine sends (`requests.jsonl`); Locust users (`harness/load/locustfile.py`) replay them. With
`workers` > 0 Locust runs distributed: a master and that many local worker processes, all on
127.0.0.1.

What Locust can and cannot say: latency percentiles come from its histogram (rounded to two
significant digits above 100 ms) over successful requests only; throughput is over Locust's
own window; samples/s and tokens/s use the mean size of the replayed requests; MFU, send lag
and the schedule checks of `bench run` do not apply (Locust users are closed-loop clients).
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from harness.measure.metrics import P99_MIN_REQUESTS
from harness.scenario.fields import MAX_CONCURRENCY as MAX_USERS, MAX_REQUESTS, MAX_SECONDS
from engines.base import EngineError
from engines.sglang import protocol
from engines.base import PrefillRequest
from engines.tokens import encode, label_ids
from harness.workload.presets import resolve_model
from harness.workload.requests import build_workload, load_tokenizer
from engines.tokens import encode
from engines.validate import split_query
from harness.report.provenance import environment, git_sha
from harness.report.tables import RESULT_COLUMNS
import harness

# never import locust here: it monkey-patches the process with gevent
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
REQUESTS_ENV = "BENCH_LOCUST_REQUESTS"  # the requests file (JSONL) users replay
WORKERS_ENV = "BENCH_LOCUST_WORKERS"  # how many workers share it
TIMEOUT_ENV = "BENCH_LOCUST_TIMEOUT_S"  # per request
FAILED = " failed"  # suffix of the name failed requests are recorded under
Log = Callable[[str], None]


@dataclass(frozen=True)
class LoadSpec:
    host: str
    users: int
    spawn_rate: float
    run_time_s: float
    workers: int = 0
    pool: int = 1000  # distinct requests prepared; users cycle through them
    timeout_s: float = 60.0  # per request
    stop_timeout_s: float = 10.0  # in-flight requests may finish after the run time

    def __post_init__(self):
        if self.users < 1 or self.spawn_rate <= 0 or self.run_time_s <= 0 or self.workers < 0 or self.pool < 1:
            raise ValueError("need users >= 1, spawn rate > 0, run time > 0, workers >= 0, pool >= 1")
        if not math.isfinite(self.spawn_rate) or self.users > MAX_USERS or self.pool > MAX_REQUESTS:
            raise ValueError(f"need a finite spawn rate, users <= {MAX_USERS:,} and pool <= {MAX_REQUESTS:,}")
        if self.run_time_s > MAX_SECONDS:
            raise ValueError(f"run time {self.run_time_s:,.0f} s > {MAX_SECONDS:,.0f} s (a week)")
        if self.workers > max_workers():  # each a process of this machine
            raise ValueError(f"--workers {self.workers}: at most {max_workers()} local worker processes "
                             f"(4 per CPU here)")
        url = urlsplit(self.host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"--host {self.host!r}: give the server's URL, e.g. http://127.0.0.1:30000")


def max_workers() -> int:
    return 4 * (os.cpu_count() or 1)


def outcome(status: int, error: BaseException | None, payload_text: str, item: dict) -> str | None:
    """A Locust user's verdict on one answer: None if good, else "rejected: ..." (4xx),
    "timeout: ..." or "error: ..." (5xx, connection, an answer of the wrong shape)."""

    if status == 0 or error is not None and status < 200:
        timed_out = isinstance(error, (socket.timeout, TimeoutError)) or "timed out" in str(error).lower()
        return f"timeout: {type(error).__name__}" if timed_out else f"error: {type(error).__name__}"
    if 400 <= status < 500:
        return f"rejected: HTTP {status}"
    if status != 200:
        return f"error: HTTP {status}"
    try:
        payload = json.loads(payload_text)
        if item["route"] == "/v1/score":
            protocol.parse_scores(payload, item["items"], item["labels"])
        elif len(protocol.parse_beams(payload, item["beams"])) != item["beams"]:
            return "error: wrong number of beams"
    except (ValueError, EngineError) as e:
        return f"error: bad answer: {type(e).__name__}"
    return None


def parse_duration(text: str) -> float:
    """Seconds from '90', '90s', '2m', '1h30m' (Locust's --run-time forms)."""
    text = text.strip()
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text)
    if not text or not m:
        raise ValueError(f"run time {text!r}: use seconds or a form like 30s, 2m, 1h30m")
    h, mnt, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mnt * 60 + s


def write_request_pool(scenario, path: Path, n: int, base_dir: Path | None = None, log: Log = print) -> dict:
    """The scenario's first `n` requests as SGLang bodies, one JSON line each; returns their
    mean samples and tokens per request."""

    tok = load_tokenizer(resolve_model(scenario.model, log))
    items = build_workload(scenario, tok, base_dir)
    samples = tokens = 0
    constrained = False
    with open(path, "w") as f:
        for i in range(n):
            item, req = items[i], items[i].request
            if isinstance(req, PrefillRequest):
                query, ids = _query_items(tok, req)
                labels = label_ids(tok, req.labels)
                line = {"route": "/v1/score", "body": json.dumps(protocol.score_body(query, ids, labels)),
                        "items": len(ids), "labels": len(labels)}
                tokens += sum(len(query) + len(i) for i in ids)
            else:
                prompt = encode(tok, req.prompt)
                line = {"route": "/generate", "body": json.dumps(protocol.generate_body(prompt, req.beam_width,
                                                                                         req.decode_steps)),
                        "beams": req.beam_width}
                tokens += len(prompt) + req.beam_width * req.decode_steps
                constrained |= req.allowed is not None
            samples += item.samples
            f.write(json.dumps(line) + "\n")
    if constrained:
        log("note: the scenario's item codes are not in the bodies (SGLang's protocol has no field for them); "
            "`bench serve` applies the scenario's codes itself, a real SGLang server does not")
    return {"requests": n, "samples_per_request": samples / n, "tokens_per_request": tokens / n}


def _query_items(tok, req) -> tuple[list[int], list[list[int]]]:
    """A scoring request's body parts: its query and items, or an empty query and the samples."""

    if req.has_query:
        return split_query(tok, req.query, req.items)
    return [], [encode(tok, s) for s in req.samples]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def locust_commands(spec: LoadSpec, csv_prefix: Path) -> list[list[str]]:
    """The master (or the single local process) first, then the workers."""
    base = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", spec.host, "--loglevel", "WARNING"]
    main = base + ["--headless", "-u", str(spec.users), "-r", f"{spec.spawn_rate:g}",
                   "-t", f"{max(int(round(spec.run_time_s)), 1)}s", "--stop-timeout", f"{spec.stop_timeout_s:g}",
                   "--csv", str(csv_prefix), "--exit-code-on-error", "0", "--only-summary"]
    if not spec.workers:
        return [main]
    port = str(_free_port())
    main += ["--master", "--expect-workers", str(spec.workers), "--expect-workers-max-wait", "120",
             "--master-bind-host", "127.0.0.1", "--master-bind-port", port]
    worker = base + ["--worker", "--master-host", "127.0.0.1", "--master-port", port]
    return [main] + [worker] * spec.workers


def run_locust(spec: LoadSpec, requests_path: Path, out_dir: Path, log: Log = print) -> Path:
    """Run Locust to the end; return the CSV prefix its stats were written under."""
    prefix = out_dir / "locust"
    env = {**os.environ, REQUESTS_ENV: str(requests_path), WORKERS_ENV: str(max(spec.workers, 1)),
           TIMEOUT_ENV: f"{spec.timeout_s:g}", "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []
    try:
        for k, cmd in enumerate(locust_commands(spec, prefix)):
            name = "master" if k == 0 and spec.workers else ("worker-%d" % k if k else "locust")
            with open(out_dir / f"locust-{name}.log", "wb") as logf:
                procs.append(subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env))
        log(f"locust: {spec.users} users against {spec.host} for {spec.run_time_s:g} s"
            + (f", master + {spec.workers} workers" if spec.workers else ""))
        code = procs[0].wait(timeout=spec.run_time_s + spec.stop_timeout_s + 180)
        for p in procs[1:]:
            p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"locust did not finish in time; see {out_dir}/locust-*.log") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if code != 0 or not (out_dir / "locust_stats.csv").exists():
        tail = (out_dir / f"locust-{'master' if spec.workers else 'locust'}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"locust exited with code {code}:\n{tail}")
    return prefix


def _num(v: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def locust_row(prefix: Path, scenario: str, engine: str, users: int, pool: dict) -> dict[str, Any]:
    """One results.csv row (harness columns) from Locust's stats and failures CSVs."""
    stats = list(csv.DictReader(open(f"{prefix}_stats.csv")))
    failures = list(csv.DictReader(open(f"{prefix}_failures.csv")))
    agg = next(r for r in stats if r["Name"] == "Aggregated")
    ok_rows = [r for r in stats if r["Name"] != "Aggregated" and not r["Name"].endswith(FAILED)]
    ok = int(sum(_num(r["Request Count"]) - _num(r["Failure Count"]) for r in ok_rows))
    kinds = {"rejected": 0, "timeout": 0, "error": 0}
    for f in failures:
        kind = next((k for k in kinds if k in f["Error"]), "error")
        kinds[kind] += int(_num(f["Occurrences"]))
    best = max(ok_rows, key=lambda r: _num(r["Request Count"]), default=None)
    lat = {k: _num(best[col]) if best and ok else float("nan") for k, col in
           (("mean_ms", "Average Response Time"), ("p50_ms", "50%"), ("p90_ms", "90%"), ("p99_ms", "99%"),
            ("max_ms", "Max Response Time"))}
    total, rps = _num(agg["Request Count"]), _num(agg["Requests/s"])
    window = total / rps if rps > 0 else float("nan")
    qps = ok / window if window > 0 else float("nan")
    return {"scenario": scenario, "engine": engine, "load_mode": "locust", "load_value": users,
            "requests": ok + sum(kinds.values()), "ok": ok, "errors": kinds["error"], "timeouts": kinds["timeout"],
            "rejected": kinds["rejected"], **lat, "p99_estimate": ok < P99_MIN_REQUESTS, "qps": qps,
            "samples_per_s": qps * pool["samples_per_request"], "tokens_per_s": qps * pool["tokens_per_request"],
            "window_s": window, "interrupted": ""}


def write_outputs(out_dir: Path, row: dict[str, Any], context: dict[str, Any]) -> list[Path]:
    results = out_dir / "results.csv"
    with open(results, "w", newline="") as f:
        w = csv.DictWriter(f, RESULT_COLUMNS, restval="", extrasaction="ignore")
        w.writeheader()
        w.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
    prefix = out_dir / "locust"
    run = {"kind": "locust", "harness": {"version": harness.__version__, "git_sha": git_sha()},
           "environment": environment(), **context, "results": [row],
           "locust_stats": list(csv.DictReader(open(f"{prefix}_stats.csv"))),
           "locust_failures": list(csv.DictReader(open(f"{prefix}_failures.csv")))}
    run_json = out_dir / "run.json"
    run_json.write_text(json.dumps(run, indent=2, default=str))
    return [results, run_json]


def run_load(scenario, scenario_path: Path, spec: LoadSpec, out_dir: Path, engine_label: str | None = None,
             command: list[str] | None = None, log: Log = print) -> tuple[dict[str, Any], list[Path]]:
    from importlib.metadata import version

    out_dir.mkdir(parents=True, exist_ok=True)
    requests_path = out_dir / "requests.jsonl"
    pool = write_request_pool(scenario, requests_path, spec.pool, scenario_path.parent, log)
    t0 = time.time()
    prefix = run_locust(spec, requests_path, out_dir, log)
    row = locust_row(prefix, scenario.name, engine_label or f"http {spec.host}", spec.users, pool)
    text = scenario_path.read_text()
    context = {"command": command or sys.argv, "started": t0, "locust_version": version("locust"),
               "load": asdict(spec), "request_pool": pool,
               "scenario": {"path": str(scenario_path), "sha256": hashlib.sha256(text.encode()).hexdigest(),
                            "content": scenario.model_dump(mode="json"), "text": text},
               "notes": [__doc__.split("\n\n")[-1].strip()]}
    return row, write_outputs(out_dir, row, context)
