"""The sglang engine's request handling and failure paths, without SGLang: an in-process
mock transport for the HTTP mapping, and a fake `sglang.launch_server` (fake_server/) for
launching, health waiting, process-group stop and a server that dies."""
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from engines.base import (BeamRequest, Bounds, EngineConfig, EngineDied, EngineError,
                          EngineUnavailable, PrefillRequest, RequestRejected)
from engines.registry import engine_class
from engines.sglang import ServerDied, SGLangEngine

FAKE = Path(__file__).parent / "fake_server"


def mock_engine(tiny_dir, handler, **options):
    options = {"url": "http://sglang.test", **options}
    cfg = EngineConfig(tiny_dir, "float32", bounds=Bounds(max_samples_per_request=8), options=options)
    engine = SGLangEngine(cfg, transport=httpx.MockTransport(handler))
    engine.start()
    return engine


def routes(score=None, generate=None, health=None):
    """A mock SGLang: /server_info always answers; the rest as given. Route functions may be
    async (MockTransport awaits what the handler returns on the async client)."""
    def handler(request: httpx.Request):
        path = request.url.path
        if path == "/server_info":
            return httpx.Response(200, json={"version": "0.5.23", "device": "cpu", "dtype": "float32"})
        if path == "/health":
            return health(request) if health else httpx.Response(200)
        route = {"/v1/score": score, "/generate": generate}[path]
        return route(json.loads(request.content))
    return handler


def test_registry_finds_the_engine():
    assert engine_class("sglang") is SGLangEngine


def test_one_call_per_business_request_with_label_strings(tiny_dir, tokenizer):
    calls = []

    def score(body):
        calls.append(body)
        return httpx.Response(200, json={"scores": [[0.1 * i, 1 - 0.1 * i] for i in range(len(body["items"]))]})

    engine = mock_engine(tiny_dir, routes(score=score))
    res = asyncio.run(engine.submit(PrefillRequest("r", [" the cat", [5, 6, 7]], [" yes", " no"])))
    assert res.scores == [[0.0, 1.0], [0.1, 0.9]]
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert calls == [{"query": [], "items": [enc(" the cat"), [5, 6, 7]],
                      "label_token_ids": enc(" yes") + enc(" no"), "apply_softmax": True}]
    assert engine.describe().version == "0.5.23"


def test_a_query_request_goes_as_query_and_items(tiny_dir, tokenizer):
    calls = []

    def score(body):
        calls.append(body)
        return httpx.Response(200, json={"scores": [[0.5, 0.5]] * len(body["items"])})

    engine = mock_engine(tiny_dir, routes(score=score))
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    res = asyncio.run(engine.submit(PrefillRequest.with_query("q", " is it about", [" cats", " dogs"], [1, 2])))
    assert res.scores == [[0.5, 0.5]] * 2
    assert calls[0]["query"] == enc(" is it about") and calls[0]["items"] == [enc(" cats"), enc(" dogs")]
    asyncio.run(engine.submit(PrefillRequest.with_query("i", [9, 8], [[1], [2, 3]], [1, 2])))
    assert (calls[1]["query"], calls[1]["items"]) == ([9, 8], [[1], [2, 3]])
    with pytest.raises(RequestRejected, match="max_samples_per_request"):
        asyncio.run(engine.submit(PrefillRequest.with_query("x", [9], [[1]] * 9, [1, 2])))
    assert len(calls) == 2  # refused before sending
    assert engine.describe().details["radix_cache"] == "on (not reported by the server)"
    assert engine.describe().details["multi_item_scoring"] == "off"
    per = mock_engine(tiny_dir, routes(score=score), per_sample=True, server_args=["--disable-radix-cache"])
    asyncio.run(per.submit(PrefillRequest.with_query("p", [9, 8], [[1], [2, 3], [4]], [1, 2])))
    assert [(c["query"], c["items"]) for c in calls[2:]] == [([9, 8], [[1]]), ([9, 8], [[2, 3]]), ([9, 8], [[4]])]
    assert per.describe().details["radix_cache"] == "off"


def test_per_sample_reassembles_in_order_when_answers_come_back_out_of_order(tiny_dir):
    calls = []

    async def score(body):
        (item,) = body["items"]
        calls.append(item)
        await asyncio.sleep(0.05 * (5 - len(item)))  # the longest sample answers first
        return httpx.Response(200, json={"scores": [[len(item) / 10, 1 - len(item) / 10]]})

    engine = mock_engine(tiny_dir, routes(score=score), per_sample=True)
    samples = [[1], [1, 2], [1, 2, 3], [1, 2, 3, 4]]
    res = asyncio.run(engine.submit(PrefillRequest("r", samples, [10, 20])))
    for got, want in zip(res.scores, [[0.1, 0.9], [0.2, 0.8], [0.3, 0.7], [0.4, 0.6]], strict=True):
        assert got == pytest.approx(want)
    assert sorted(map(len, calls)) == [1, 2, 3, 4]


def test_client_errors_are_rejections_and_server_errors_are_engine_errors(tiny_dir):
    answers = iter([httpx.Response(400, json={"object": "error", "message": "Token ID 151645 is out of vocabulary"}),
                    httpx.Response(500, json={"error": {"message": "scheduler exploded"}}),
                    httpx.Response(200, json={"scores": [[0.5, 0.5]]})])
    engine = mock_engine(tiny_dir, routes(score=lambda body: next(answers)))
    req = PrefillRequest("r", [[1, 2]], [151645, 5])
    with pytest.raises(RequestRejected, match="out of vocabulary"):
        asyncio.run(engine.submit(req))
    with pytest.raises(EngineError, match="HTTP 500.*scheduler exploded") as e:
        asyncio.run(engine.submit(req))
    assert not isinstance(e.value, ServerDied)
    assert asyncio.run(engine.submit(req)).scores == [[0.5, 0.5]]  # one bad request does not end the run


def test_refused_connection_with_no_health_means_the_server_died(tiny_dir):
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    engine = mock_engine(tiny_dir, routes(score=lambda body: refuse(None), health=refuse))
    with pytest.raises(ServerDied, match="no longer answers"):
        asyncio.run(engine.submit(PrefillRequest("r", [[1]], [1, 2])))
    with pytest.raises(EngineDied):  # every later request fails fast, as the type the harness stops on
        asyncio.run(engine.submit(BeamRequest("b", [1, 2], 2, 2)))


def test_a_dropped_connection_to_a_healthy_server_is_one_failed_request(tiny_dir):
    def drop(body):
        raise httpx.ReadError("connection reset")

    engine = mock_engine(tiny_dir, routes(score=drop))
    with pytest.raises(EngineError, match="ReadError") as e:
        asyncio.run(engine.submit(PrefillRequest("r", [[1]], [1, 2])))
    assert not isinstance(e.value, ServerDied)


def test_allowed_codes_and_bounds_are_rejected_before_sending(tiny_dir):
    engine = mock_engine(tiny_dir, routes())  # any request reaching the mock would fail with KeyError
    with pytest.raises(RequestRejected, match="allowed item codes"):
        asyncio.run(engine.submit(BeamRequest("b", [1, 2], 2, 2, allowed=[[3, 4]])))
    with pytest.raises(RequestRejected, match="max_samples_per_request"):
        asyncio.run(engine.submit(PrefillRequest("r", [[1]] * 9, [1, 2])))
    with pytest.raises(RequestRejected, match="one token"):
        asyncio.run(engine.submit(PrefillRequest("r", [[1]], [" yes", " definitely not"])))


def test_options_are_validated():
    cfg = EngineConfig(Path("."), options={"url": "http://x", "per_sampel": True})
    with pytest.raises(EngineUnavailable, match="per_sampel.*allowed: url"):
        SGLangEngine.check_available(cfg)


def test_check_available_without_env_or_server(tmp_path):
    with pytest.raises(EngineUnavailable, match="no SGLang environment"):
        SGLangEngine.check_available(EngineConfig(tmp_path, options={"python": str(tmp_path / "nope")}))
    with pytest.raises(EngineUnavailable, match="no healthy SGLang server"):
        SGLangEngine.check_available(EngineConfig(tmp_path, options={"url": "http://127.0.0.1:9"}))


# -- a launched (fake) server --------------------------------------------------------------

@pytest.fixture
def fake_env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]))


def launched(tiny_dir, tmp_path, **options):
    options = {"python": sys.executable, "startup_timeout_s": 30, "log_path": str(tmp_path / "server.log"),
               **options}
    engine = SGLangEngine(EngineConfig(tiny_dir, "float32", options=options))
    engine.start()
    return engine


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """The process no longer runs (exited, or a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def test_launch_passes_cpu_settings_and_stop_ends_the_process_group(tiny_dir, tmp_path, fake_env):
    engine = launched(tiny_dir, tmp_path, per_sample=True)
    try:
        cmd = engine.describe().details["launch_command"]
        assert "--device cpu --attention-backend torch_native --max-total-tokens 16384" in cmd
        assert f"--model-path {tiny_dir}" in cmd and "--dtype float32" in cmd
        res = asyncio.run(engine.submit(PrefillRequest("r", [[1, 2, 3], [4]], [7, 8, 9])))
        assert res.scores == [[0.75, 0.125, 0.125], [0.5, 0.25, 0.25]]  # exact in binary
        beams = asyncio.run(engine.submit(BeamRequest("b", [1, 2, 40], 3, 2))).beams
        assert [b.token_ids for b in beams] == [[40, 40], [41, 41], [42, 42]]
        assert [b.logprob for b in beams] == [-2.0, -4.0, -6.0]
        scheduler = engine._server_info["scheduler_pid"]
    finally:
        engine.stop()
    assert _gone(scheduler), "the server's child process outlived stop()"


def test_failed_start_up_reports_the_server_log(tiny_dir, tmp_path, fake_env):
    with pytest.raises(EngineUnavailable, match="exited with code 3(.|\n)*refusing to start"):
        launched(tiny_dir, tmp_path, server_args=["--fail-startup"])


def test_a_killed_server_raises_server_died(tiny_dir, tmp_path, fake_env):
    engine = launched(tiny_dir, tmp_path)
    try:
        assert asyncio.run(engine.submit(PrefillRequest("r", [[1]], [1, 2]))).scores
        os.killpg(engine._server.pid, signal.SIGKILL)
        with pytest.raises(ServerDied, match="exited with code"):
            asyncio.run(engine.submit(PrefillRequest("r", [[1]], [1, 2])))
    finally:
        engine.stop()


def test_a_slow_answer_times_out_as_an_engine_error(tiny_dir, tmp_path, fake_env):
    engine = launched(tiny_dir, tmp_path, server_args="--hang-s 2", timeout_s=0.3)
    try:
        with pytest.raises(EngineError, match="timed out after 0.3 s") as e:
            asyncio.run(engine.submit(BeamRequest("b", [1, 2], 2, 2)))
        assert not isinstance(e.value, ServerDied)
    finally:
        engine.stop()
