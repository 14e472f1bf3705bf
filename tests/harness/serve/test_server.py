"""`bench serve` as a real subprocess on a free loopback port, with the tiny preset and the hf
engine: answers against `bench infer`, the sglang engine pointed at it, bad input, overload,
disconnects and graceful shutdown."""
from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from engines.base import BeamRequest, Bounds, EngineConfig, PrefillRequest
from harness.serve.api import ApiError
from harness.run.infer import infer_file
from harness.serve.guards import Admission, ClientGone, until_disconnect
from harness.serve.metrics import ServerMetrics
from harness.load.process import ServeProcess

# beams W <= 8, 3 steps; up to 4 samples of 32 tokens
SCENARIO = """
name: serve_test
model: tiny
dtype: float32
task: {kind: beam_search, beam_width: 8, decode_steps: 3}
workload: {prompt_tokens: {mean: 16, min: 8, max: 24}, seed: 0}
bounds: {max_samples_per_request: 4, max_prompt_tokens: 32}
load: {mode: closed, concurrency: [1], requests: 4}
engines: [hf]
"""
# a slow mix for overload: 16 beams of 4 tokens on 60-token prompts
SLOW = SCENARIO.replace("beam_width: 8, decode_steps: 3", "beam_width: 16, decode_steps: 4").replace(
    "max_prompt_tokens: 32", "max_prompt_tokens: 64")
WORDS = " the item code is a short list of words"
# relevance: the bounded engine listed twice (sharing the query, and not), as relevance_15 lists it
QUERY = """
name: serve_query_test
model: tiny
dtype: float32
task: {kind: prefill_only, labels: [" yes", " no"]}
workload: {query_tokens: {mean: 8, min: 4, max: 12}, item_tokens: {mean: 6, min: 2, max: 10}, items_per_request: 3}
bounds: {max_samples_per_request: 4, max_prompt_tokens: 64, max_query_tokens: 32, max_item_tokens: 32}
load: {mode: closed, concurrency: [1], requests: 2}
engines: [{name: bounded, compile: eager}, {name: bounded, label: bounded-noshare, share_query: false, compile: eager}]
"""


def _scenario(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_dir):
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def server(folder):
    with ServeProcess(_scenario(folder, "s.yaml", SCENARIO), "hf", ["--max-body-bytes", "65536"]) as s:
        yield s


@pytest.fixture(scope="module")
def slow_server(folder):
    path = _scenario(folder, "slow.yaml", SLOW)
    with ServeProcess(path, "hf", ["--concurrency", "1", "--max-queue", "2"]) as s:
        yield s


def _metric(url: str, name: str, **labels) -> float:
    text = httpx.get(f"{url}/metrics").text
    sel = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = rf"^{re.escape(name)}{re.escape('{' + sel + '}') if labels else ''} (\S+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def _flat(rows):
    return [x for row in rows for x in row]


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_routes_match_bench_infer(server, tokenizer, tmp_path):
    samples = [WORDS, " hello there friend", " a"]
    labels = [" yes", " no"]
    reqs = [{"id": "p", "kind": "prefill_only", "samples": samples, "labels": labels},
            {"id": "b", "kind": "beam_search", "prompt": WORDS, "beam_width": 5, "decode_steps": 3}]
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(json.dumps(r) for r in reqs))
    infer_file("hf", "tiny", inp, outp, log=lambda m: None)
    ref = {line["id"]: line for line in map(json.loads, outp.read_text().splitlines())}

    label_ids = [_ids(tokenizer, lab)[0] for lab in labels]
    r = httpx.post(f"{server.url}/v1/score", json={"query": "", "items": samples, "label_token_ids": label_ids,
                                                   "apply_softmax": True})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "scoring"
    assert _flat(r.json()["scores"]) == pytest.approx(_flat(ref["p"]["scores"]), abs=1e-5)
    # the same samples as token ids, split into query + item
    ids = [_ids(tokenizer, s) for s in samples]
    r = httpx.post(f"{server.url}/v1/score", json={"query": ids[0][:2], "items": [i[2:] if k == 0 else i for k, i in
                                                   enumerate(ids)][:1], "label_token_ids": label_ids,
                                                   "apply_softmax": True})
    assert r.json()["scores"][0] == pytest.approx(ref["p"]["scores"][0], abs=1e-5)

    r = httpx.post(f"{server.url}/generate", json={"text": WORDS, "sampling_params": {
        "beam_width": 5, "n": 5, "max_new_tokens": 3, "temperature": 0}})
    assert r.status_code == 200, r.text
    beams = r.json()["meta_info"]["beam_results"]
    want = ref["b"]["beams"]
    assert [b["output_ids"] for b in beams] == [b["token_ids"] for b in want]
    assert r.json()["output_ids"] == want[0]["token_ids"]
    for got, ref_beam in zip(beams, want):  # SGLang's sequence_score: cumulative log-prob / length
        assert got["meta_info"]["sequence_score"] * 3 == pytest.approx(ref_beam["logprob"], abs=1e-4)
        assert got["text"] == ref_beam["text"]


def test_sglang_engine_against_bench_serve_matches_infer(server, tiny_dir, tmp_path):
    """The harness's SGLang client, unchanged, measures `bench serve` like a real SGLang server."""
    from engines.registry import create_engine

    reqs = [PrefillRequest("p", [WORDS, [5, 6, 7]], [" yes", " no"]), BeamRequest("b", WORDS, 8, 3)]
    lines = [{"id": "p", "kind": "prefill_only", "samples": [WORDS, [5, 6, 7]], "labels": [" yes", " no"]},
             {"id": "b", "kind": "beam_search", "prompt": WORDS, "beam_width": 8, "decode_steps": 3}]
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(map(json.dumps, lines)))
    infer_file("hf", "tiny", inp, outp, log=lambda m: None)
    ref = [json.loads(line) for line in outp.read_text().splitlines()]

    cfg = EngineConfig(tiny_dir, "float32", bounds=Bounds(4, 32, 8, 3), options={"url": server.url})
    engine = create_engine("sglang", cfg)
    engine.start()
    try:
        score, beams = asyncio.run(_submit_all(engine, reqs))
    finally:
        engine.stop()
    assert _flat(score.scores) == pytest.approx(_flat(ref[0]["scores"]), abs=1e-5)
    assert [b.token_ids for b in beams.beams] == [b["token_ids"] for b in ref[1]["beams"]]
    assert [b.logprob for b in beams.beams] == pytest.approx([b["logprob"] for b in ref[1]["beams"]], abs=1e-4)


def test_bounded_serves_a_query_shared_by_its_items(folder, tokenizer, tmp_path):
    """/v1/score's query + items reach the bounded engine as a query request (its query
    prefilled once) and answer like transformers on the concatenations."""
    query, items, labels = " is this about shoes:", [" red running shoes", " a cat", "?"], [" yes", " no"]
    ids = [_ids(tokenizer, query), [_ids(tokenizer, i) for i in items]]
    lines = [{"id": "t", "kind": "prefill_only", "query": query, "items": items, "labels": labels},
             {"id": "i", "kind": "prefill_only", "query": ids[0], "items": ids[1], "labels": labels}]
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(map(json.dumps, lines)))
    infer_file("hf", "tiny", inp, outp, log=lambda m: None)
    want = {line["id"]: line["scores"] for line in map(json.loads, outp.read_text().splitlines())}
    label_ids = [_ids(tokenizer, lab)[0] for lab in labels]
    with ServeProcess(_scenario(folder, "query.yaml", QUERY), "bounded") as s:
        for rid, (q, its) in {"t": (query, items), "i": ids}.items():
            r = httpx.post(f"{s.url}/v1/score", json={"query": q, "items": its, "label_token_ids": label_ids,
                                                      "apply_softmax": True})
            assert r.status_code == 200, r.text
            assert _flat(r.json()["scores"]) == pytest.approx(_flat(want[rid]), abs=1e-4)
        served = httpx.get(f"{s.url}/server_info").json()["engine"]["prefill_only"]
    assert served["share_query"] is True  # the plain `bounded` entry, not its no-sharing twin


def test_a_served_label_picks_its_entry():
    from harness.scenario.files import load_scenario
    from harness.serve.engine import serving_spec

    sc = load_scenario(Path(__file__).parents[3] / "scenarios" / "relevance_15.yaml")
    assert (serving_spec(sc, "bounded").name, serving_spec(sc, "bounded").options) == ("bounded", {})
    assert (serving_spec(sc, "bounded-noshare").name, serving_spec(sc, "bounded-noshare").options) == \
        ("bounded", {"share_query": False})
    assert serving_spec(sc, "sglang-noradix").options == {"server_args": ["--disable-radix-cache"]}
    assert serving_spec(sc, "noop").options == {}  # not listed: the engine plain


async def _submit_all(engine, reqs):
    return [await engine.submit(r) for r in reqs]


def _bad_requests(tokenizer) -> list[tuple[str, bytes | dict, int]]:
    """(route, body, expected status): wrong types, bounds, shapes, JSON, size."""
    ok_ids = _ids(tokenizer, WORDS)
    s = {"query": "", "items": [WORDS], "label_token_ids": [9693, 2152], "apply_softmax": True}
    g = {"input_ids": ok_ids, "sampling_params": {"beam_width": 4, "max_new_tokens": 3, "temperature": 0}}

    def sp(**kw):
        return {**g, "sampling_params": {**g["sampling_params"], **kw}}

    score = [{**s, "items": 5}, {**s, "items": [1, 2]}, {**s, "items": []}, {**s, "items": [WORDS] * 5},
             {**s, "items": [WORDS * 10]}, {**s, "items": [list(range(10, 50))]}, {**s, "items": [[]]},
             {**s, "query": [1, 2]}, {**s, "label_token_ids": ["a"]}, {**s, "label_token_ids": []},
             {**s, "label_token_ids": [10 ** 9]}, {**s, "label_token_ids": [-1]}, {**s, "apply_softmax": False},
             {**s, "apply_softmax": "yes"}, {**s, "extra": 1}, {k: v for k, v in s.items() if k != "items"},
             {**s, "query": None}, {**s, "items": [[1.5]]}, {**s, "item_first": 1}, {**s, "items": {"a": 1}}]
    gen = [sp(beam_width=9), sp(beam_width=0), sp(max_new_tokens=4), sp(max_new_tokens=0), sp(n=5),
           sp(temperature=0.7), sp(top_p=0.9), sp(beam_width="4"), sp(min_new_tokens=9),
           {**g, "text": WORDS}, {"sampling_params": g["sampling_params"]}, {**g, "input_ids": []},
           {**g, "input_ids": list(range(1, 40))}, {**g, "input_ids": [10 ** 40]}, {**g, "input_ids": "abc"},
           {**g, "stream": True}, {**g, "sampling_params": []}, {**g, "rid": 7}, {**g, "unknown": True},
           {"text": WORDS * 20, "sampling_params": g["sampling_params"]}]
    raw = [b"{bad", b"", b"[]", b"null", b"\xff\xfe\x00", b'{"items": [', b"42", b'"text"']
    big = json.dumps({**s, "items": ["x" * 70000]}).encode()
    out = [("/v1/score", b, 400) for b in score] + [("/generate", b, 400) for b in gen]
    out += [(route, b, 400) for b in raw for route in ("/v1/score", "/generate")]
    out += [("/v1/score", big, 413), ("/generate", big, 413)]
    return out


def test_bad_requests_get_a_4xx_with_a_message_and_good_ones_still_succeed(server, tokenizer):
    bad = _bad_requests(tokenizer)
    bad = (bad * (200 // len(bad) + 1))[:200]
    good = {"query": "", "items": [WORDS, " hi"], "label_token_ids": [9693, 2152], "apply_softmax": True}
    ok_before = _metric(server.url, "bench_requests_total", route="/v1/score", code="200")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for i, (route, body, status) in enumerate(bad):
            if i % 10 == 0:
                g = client.post("/v1/score", json=good)
                assert g.status_code == 200, g.text
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = client.post(route, content=content, headers={"content-type": "application/json"})
            assert r.status_code == status, (route, body if len(content) < 300 else len(content), r.text)
            err = r.json()
            assert err["object"] == "error" and err["code"] == status and len(err["message"]) > 10, err
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    assert _metric(server.url, "bench_requests_total", route="/v1/score", code="200") - ok_before == 20
    bad_seen = sum(_metric(server.url, "bench_requests_total", route=r, code=c)
                   for r in ("/v1/score", "/generate") for c in ("400", "413"))
    assert bad_seen >= 200


def test_oversize_chunked_body_is_cut_off_at_the_limit(server):
    """No Content-Length to refuse early: the streamed body is counted as it arrives."""
    chunks = iter([b'{"items": ["' + b"x" * 40000, b"x" * 40000 + b'"]}'])
    r = httpx.post(f"{server.url}/v1/score", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "65536" in r.json()["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_error_messages_name_the_problem(server):
    r = httpx.post(f"{server.url}/generate", json={"input_ids": [1, 2], "sampling_params": {
        "beam_width": 64, "max_new_tokens": 3}})
    assert "sampling_params.beam_width: 64 outside 1..8" in r.json()["message"]
    r = httpx.post(f"{server.url}/v1/score", json={"items": [list(range(1, 40))], "label_token_ids": [1, 2],
                                                   "query": [], "apply_softmax": True})
    assert "39 tokens > max_prompt_tokens 32" in r.json()["message"]
    r = httpx.post(f"{server.url}/v1/score", json={"items": ["a"], "label_token_ids": [1], "apply_sofmax": True})
    assert "apply_sofmax: unknown field" in r.json()["message"]


def test_admission_bounds_running_plus_queued():
    async def main():
        adm = Admission(concurrency=1, max_queue=2)
        release = asyncio.Event()

        async def hold():
            async with adm.slot():
                await release.wait()

        held = [asyncio.create_task(hold()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert (adm.running, adm.waiting) == (1, 2)
        with pytest.raises(ApiError) as e:
            async with adm.slot():
                pass
        assert e.value.status == 429 and "queue bound 2" in e.value.message
        release.set()
        await asyncio.gather(*held)
        assert (adm.running, adm.waiting) == (0, 0)
        async with adm.slot():  # recovered
            assert adm.running == 1

    asyncio.run(main())


def test_until_disconnect_cancels_the_work_when_the_client_leaves():
    async def main():
        gone = asyncio.Event()
        cancelled = []

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        async def work():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        assert await until_disconnect(receive, asyncio.sleep(0, result=7)) == 7
        asyncio.get_running_loop().call_later(0.02, gone.set)
        with pytest.raises(ClientGone):
            await until_disconnect(receive, work())
        assert cancelled == [True]

    asyncio.run(main())


def test_engine_counters_are_exported():
    from prometheus_client import generate_latest

    class Batching:  # the bounded engine keeps such a dict
        stats = {"requests": 10, "batches": 4, "largest_batch": 5, "note": "not a number"}

    text = generate_latest(ServerMetrics(Admission(1, 0), Batching()).registry).decode()
    assert 'bench_engine_stat{name="requests"} 10.0' in text and 'bench_engine_stat{name="batches"} 4.0' in text
    assert "note" not in text


def test_keep_alive_requests_are_not_delayed_by_nagle(server):
    """Headers and body go out without waiting for the client's delayed ACK (~40 ms)."""
    with httpx.Client(base_url=server.url) as client:
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            client.get("/health")
            times.append(time.perf_counter() - t0)
    assert sorted(times)[len(times) // 2] < 0.03


def _slow_body(tokenizer):
    return {"input_ids": _ids(tokenizer, WORDS * 6)[:60],
            "sampling_params": {"beam_width": 16, "max_new_tokens": 4, "temperature": 0}}


async def _burst(url: str, body: dict, n: int) -> list[int]:
    """n requests at once, on connections opened beforehand so that they arrive together."""
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        await asyncio.gather(*[client.get("/health") for _ in range(n)])
        rs = await asyncio.gather(*[client.post("/generate", json=body) for _ in range(n)])
    return [r.status_code for r in rs]


def test_overload_is_answered_429_and_the_server_recovers(slow_server, tokenizer):
    body = _slow_body(tokenizer)
    assert httpx.post(f"{slow_server.url}/generate", json=body, timeout=60).status_code == 200  # warm
    codes = asyncio.run(_burst(slow_server.url, body, 24))
    assert set(codes) <= {200, 429}
    assert codes.count(429) >= 12, codes  # 1 running + 2 queued fit; a burst of 24 mostly does not
    assert codes.count(200) >= 3
    assert _metric(slow_server.url, "bench_queue_depth") == 0
    assert _metric(slow_server.url, "bench_requests_total", route="/generate", code="429") == codes.count(429)
    r = httpx.post(f"{slow_server.url}/generate", json=body, timeout=60)
    assert r.status_code == 200  # recovered


def test_disconnected_clients_release_their_work(slow_server, tokenizer):
    body = _slow_body(tokenizer)
    t0 = time.perf_counter()
    assert httpx.post(f"{slow_server.url}/generate", json=body, timeout=60).status_code == 200
    service_s = time.perf_counter() - t0
    gone_before = _metric(slow_server.url, "bench_requests_total", route="/generate", code="499")

    async def give_up() -> None:  # one runs, two wait; all three clients leave early
        async with httpx.AsyncClient(base_url=slow_server.url, timeout=service_s / 4) as client:
            await asyncio.gather(*[client.post("/generate", json=body) for _ in range(3)], return_exceptions=True)

    asyncio.run(give_up())
    deadline = time.monotonic() + 10
    while _metric(slow_server.url, "bench_requests_total", route="/generate", code="499") - gone_before < 3:
        assert time.monotonic() < deadline, "disconnects were not noticed"
        time.sleep(0.05)
    assert _metric(slow_server.url, "bench_queue_depth") == 0
    # the queued two never ran: a new request waits at most for the one that was running
    t0 = time.perf_counter()
    assert httpx.post(f"{slow_server.url}/generate", json=body, timeout=60).status_code == 200
    assert time.perf_counter() - t0 < 2.5 * service_s + 0.5


def test_health_and_metrics(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("bench_requests_total", "bench_request_latency_seconds_bucket", "bench_queue_depth",
                 "bench_in_flight", "bench_request_samples_bucket", "process_resident_memory_bytes"):
        assert name in text
    r = httpx.get(f"{server.url}/nowhere")
    assert r.status_code == 404 and r.json()["object"] == "error"
    assert httpx.get(f"{server.url}/generate").status_code == 405


def test_graceful_shutdown_finishes_in_flight_requests(slow_server, tokenizer):
    """Last in the file: it stops the module's slow server."""
    body = _slow_body(tokenizer)
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(
        httpx.post(f"{slow_server.url}/generate", json=body, timeout=60).status_code)) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while _metric(slow_server.url, "bench_in_flight") + _metric(slow_server.url, "bench_queue_depth") < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    slow_server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert codes == [200, 200, 200]  # one was running and two queued when the signal came
    assert slow_server.proc.wait(30) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(slow_server.url.rsplit(":", 1)[1])), timeout=1).close()
