"""`bench serve --ray`: replicas of the hf engine on a real local Ray instance (loopback only),
measured by the harness's own client; one replica's process killed mid-run. Plus the option
mapping, the proxy's error middleware and the CLI's messages, which need no Ray."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from engines.base import Bounds, EngineConfig
from harness.cli import app
from harness.run.infer import infer_file
from harness.load.loadgen import run_closed
from harness.load.process import ServeProcess
from harness.serve.ray_options import (CLUSTER_JOB_ENV, RayOptions, deployment_options, parse_autoscale,
                                       replica_runtime_env)
from harness.serve.replicas import ReplicaFailed
from harness.serve.server import ServeOptions

# CI installs the dev extra, Ray included: there a missing Ray fails these tests instead of skipping them
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None and os.environ.get("CI") != "true",
                               reason="ray not installed (.[ray] extra)")

SCENARIO = """
name: ray_test
model: tiny
dtype: float32
task: {kind: beam_search, beam_width: 8, decode_steps: 3}
workload: {prompt_tokens: {mean: 16, min: 8, max: 24}, seed: 0}
bounds: {max_samples_per_request: 1, max_prompt_tokens: 32}
load: {mode: closed, concurrency: [2], requests: 4, warmup_requests: 1}
engines: [hf]
"""


# -- no Ray needed --------------------------------------------------------------------------

def test_deployment_options_follow_the_serve_options():
    serve = ServeOptions(concurrency=3, max_queue=10, graceful_timeout_s=7.0)
    env = {"env_vars": {"A": "1"}}
    opts = deployment_options(RayOptions(replicas=2, cpus_per_replica=1.5, gpus_per_replica=0.5), serve, env)
    assert opts["num_replicas"] == 2 and "autoscaling_config" not in opts
    assert (opts["max_ongoing_requests"], opts["max_queued_requests"]) == (3, 10)
    assert opts["backpressure_config"] == {"status_code": 429}  # as `bench serve` answers a full queue
    assert opts["graceful_shutdown_timeout_s"] == 7.0
    assert opts["ray_actor_options"] == {"num_cpus": 1.5, "num_gpus": 0.5, "runtime_env": env}
    auto = deployment_options(RayOptions(autoscale=(0, 4)), serve, {})
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 4, "initial_replicas": 1,
                                          "target_ongoing_requests": 3}


def test_ray_options_are_checked():
    assert parse_autoscale("1:4") == (1, 4)
    for bad in ("4", "a:b", "1:"):
        with pytest.raises(ValueError, match="MIN:MAX"):
            parse_autoscale(bad)
    with pytest.raises(ValueError, match="MIN <= MAX"):
        RayOptions(autoscale=(3, 2))
    with pytest.raises(ValueError, match="replicas"):
        RayOptions(replicas=0)
    with pytest.raises(ValueError, match="cpus-per-replica"):
        RayOptions(cpus_per_replica=0)
    assert RayOptions(cpus_per_replica=0.5).threads == 1 and RayOptions(cpus_per_replica=2.5).threads == 2
    for cpus, gpus in ((float("nan"), 0.0), (1.0, float("nan")), (1.0, float("inf")), (float("inf"), 0.0)):
        with pytest.raises(ValueError, match="cpus-per-replica must be in"):  # int(inf) was an OverflowError
            RayOptions(cpus_per_replica=cpus, gpus_per_replica=gpus)
    for bad in ("nonsense", "host:99999", "host:", ":6379", "ray://host"):
        with pytest.raises(ValueError, match="give auto, HOST:PORT"):
            RayOptions(address=bad)
    assert RayOptions(address="ray://10.0.0.5:10001").address and RayOptions(address="auto").address == "auto"


def test_an_address_nothing_answers_at_is_refused_in_seconds():
    import socket

    from harness.serve.ray_options import check_reachable

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.perf_counter()
    with pytest.raises(ValueError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=5)
    assert time.perf_counter() - t < 5
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_reachable(f"ray://127.0.0.1:{s.getsockname()[1]}")  # something answers: Ray's turn


def test_replicas_run_the_drivers_code_with_threads_equal_to_their_cpus(monkeypatch):
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", "/some/cache")
    local = replica_runtime_env(2, local=True)
    assert local["env_vars"]["OMP_NUM_THREADS"] == "2" and local["env_vars"]["BOUNDED_BENCH_CACHE"] == "/some/cache"
    assert Path(local["env_vars"]["PYTHONPATH"].split(os.pathsep)[0], "harness", "serve", "replicas.py").exists()
    cluster = replica_runtime_env(1, local=False)  # a local cache path means nothing on other nodes
    assert cluster == {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    # there the code comes with the job, uploaded by Ray
    assert [Path(m).name for m in CLUSTER_JOB_ENV["py_modules"]] == ["harness", "engines"]
    assert all(Path(m, "__init__.py").exists() for m in CLUSTER_JOB_ENV["py_modules"])


async def test_proxy_middleware_names_a_failed_replica_and_passes_answers_through():
    async def dead(scope, receive, send):  # what Ray's proxy does when the replica died
        return None

    async def fine(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    for inner, status, text in ((dead, 500, "replica serving this request failed"), (fine, 200, "ok")):
        transport = httpx.ASGITransport(app=ReplicaFailed(inner))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            r = await client.post("/generate", json={})
        assert r.status_code == status and text in r.text
    assert r.text == "ok"


def test_ray_flags_need_ray_and_missing_ray_says_how_to_install(tmp_path, monkeypatch):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    r = CliRunner().invoke(app, ["serve", str(path), "--engine", "hf", "--replicas", "2"])
    assert r.exit_code == 2 and "only apply with --ray" in r.output
    r = CliRunner().invoke(app, ["serve", str(path), "--engine", "hf", "--ray", "--replicas", "2",
                                 "--autoscale", "1:2"])
    assert r.exit_code == 2 and "not both" in r.output
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    r = CliRunner().invoke(app, ["serve", str(path), "--engine", "hf", "--ray"])
    assert r.exit_code == 2 and 'pip install -e ".[ray]"' in r.output


@needs_ray
def test_unplaceable_replicas_are_an_error_before_ray_starts(tmp_path, tiny_dir):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    n = (os.cpu_count() or 1) + 1
    r = CliRunner().invoke(app, ["serve", str(path), "--engine", "hf", "--ray", "--replicas", str(n)])
    assert r.exit_code == 2 and f"{n} replicas x 1 CPUs" in r.output and "--address" in r.output
    # GPUs of a cluster's nodes are not this machine's: asked for, they must be reserved
    r = CliRunner().invoke(app, ["serve", str(path), "--engine", "hf", "--ray", "--device", "cuda",
                                 "--address", "127.0.0.1:1"])
    assert r.exit_code == 2 and "--gpus-per-replica" in r.output, r.output
    r = CliRunner().invoke(app, ["serve", str(path), "--engine", "hf", "--ray", "--gpus-per-replica", "inf"])
    assert r.exit_code == 2 and "--gpus-per-replica in [0, 1024]" in " ".join(r.output.split()), r.output


# -- a real local Ray instance --------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_dir):
    folder = tmp_path_factory.mktemp("ray")
    (folder / "s.yaml").write_text(SCENARIO)
    return folder


@pytest.fixture(scope="module")
def replicas(folder):
    args = ["--ray", "--replicas", "2", "--cpus-per-replica", "1", "--concurrency", "2"]
    # bounded, with room for a busy 2-core machine (Ray, then two replicas importing torch)
    with ServeProcess(folder / "s.yaml", "hf", args, startup_timeout_s=600) as s:
        yield s


def _deployment(url: str) -> dict:
    return httpx.get(f"{url}/server_info", timeout=30).json()["deployment"]


@needs_ray
def test_bench_run_through_the_replicas_records_their_placement(replicas, folder, tmp_path):
    info = _deployment(replicas.url)
    assert info["replicas"] == 2 and info["server"].startswith("ray serve")
    assert {p["node_ip"] for p in info["placement"]} == {"127.0.0.1"}  # a local instance stays on loopback
    scenario = folder / "via_url.yaml"
    scenario.write_text(SCENARIO.replace("engines: [hf]", f'engines: [{{name: sglang, url: "{replicas.url}"}}]'))
    r = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    described = run["engines"][0]["describe"]
    assert described["served_engine"]["name"] == "hf"
    assert described["deployment"]["replicas"] == 2 and described["deployment"]["cpus_per_replica"] == 1.0
    assert sorted(p["pid"] for p in described["deployment"]["placement"]) == sorted(
        p["pid"] for p in info["placement"])
    assert "replicas" in (tmp_path / "run" / "report.html").read_text()


@needs_ray
def test_a_killed_replica_fails_only_its_requests_and_is_replaced(replicas, folder, tiny_dir):
    from engines.registry import create_engine
    from harness.scenario.files import load_scenario
    from harness.workload.requests import build_workload, load_tokenizer

    items = build_workload(load_scenario(folder / "s.yaml"), load_tokenizer(str(tiny_dir)))
    n = 24
    reference = _infer(folder, [items[i].request for i in range(n)])
    victim = _deployment(replicas.url)["placement"][0]["pid"]
    engine = create_engine("sglang", EngineConfig(tiny_dir, "float32", bounds=Bounds(1, 32, 8, 3),
                                                  options={"url": replicas.url, "timeout_s": 120}))
    engine.start()
    try:
        point, in_flight = asyncio.run(_run_with_kill(engine, items, n, victim))
        # the run completed: every request has an outcome, only those in flight may have failed
        assert all(r.status in ("ok", "error") for r in point.records) and len(point.records) == n
        failed = [r for r in point.records if r.status != "ok"]
        assert len(failed) <= in_flight <= 3, (in_flight, [r.error for r in failed])
        for r in failed:
            assert "replica serving this request failed" in r.error, r.error
        for r in point.records:
            if r.status == "ok":
                _same_beams(r.result, reference[r.item.request.id])
        _wait_replaced(replicas.url, victim)
        assert httpx.get(f"{replicas.url}/health", timeout=30).json()["status"] == "ok"
        # afterwards the application answers everything, the failed requests too
        again = asyncio.run(_submit_all(engine, [r.item.request for r in failed] + [items[0].request]))
        for result in again:
            _same_beams(result, reference[result.id])
    finally:
        engine.stop()


async def _run_with_kill(engine, items, n: int, victim: int):
    """Closed loop, 4 clients; after the 6th answer one replica's process is killed."""
    done, state = 0, {}

    def tick(k: int = 1) -> None:
        nonlocal done
        done += k
        if done == 6:
            state["in_flight"] = sum(r.status == "pending" for r in points[0].records)
            os.kill(victim, signal.SIGKILL)

    points: list = []
    point = await run_closed(engine, items, 4, n, 0, 120.0, tick, points)
    return point, state["in_flight"]


def _infer(folder: Path, requests) -> dict:
    lines = [{"id": q.id, "kind": "beam_search", "prompt": q.prompt, "beam_width": q.beam_width,
              "decode_steps": q.decode_steps} for q in requests]
    inp, outp = folder / "ref_in.jsonl", folder / "ref_out.jsonl"
    inp.write_text("\n".join(map(json.dumps, lines)))
    infer_file("hf", "tiny", inp, outp, log=lambda m: None)
    return {line["id"]: line for line in map(json.loads, outp.read_text().splitlines())}


def _same_beams(result, ref: dict) -> None:
    assert [b.token_ids for b in result.beams] == [b["token_ids"] for b in ref["beams"]]
    assert [b.logprob for b in result.beams] == pytest.approx([b["logprob"] for b in ref["beams"]], abs=1e-4)


def _wait_replaced(url: str, victim: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = _deployment(url)
        pids = [p["pid"] for p in info["placement"] if p["state"] == "RUNNING"]
        if info["replicas"] == 2 and victim not in pids:
            return
        time.sleep(1.0)
    raise AssertionError(f"the killed replica (pid {victim}) was not replaced within {timeout_s:g} s: {info}")


async def _submit_all(engine, requests):
    return [await engine.submit(q) for q in requests]
