"""`bench serve` against slow and hostile clients (a real subprocess on loopback, tiny preset):
deadlines on the request head and body, SIGTERM with stalled connections, disconnects
mid-body counted as 499, JSON content type, allowed Host names, no absolute paths in the
public routes, long text refused before tokenizing and tokenized off the event loop; after
each attack a good request is still answered."""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from harness.load.process import ServeProcess

HEAD_S, BODY_S = 1.0, 1.5
SCENARIO = """
name: guards
model: tiny
dtype: float32
task: {kind: prefill_only, labels: [" yes", " no"]}
workload: {samples_per_request: 2, prompt_tokens: 8}
bounds: {max_samples_per_request: 8, max_prompt_tokens: 64, on_violation: %s}
load: {mode: closed, concurrency: [1], requests: 4}
engines: [hf]
"""
GOOD = {"query": "", "items": [" is it a cat", " red"], "label_token_ids": [9693, 2152], "apply_softmax": True}


def _serve(folder: Path, name: str, violation: str, *args: str) -> ServeProcess:
    path = folder / f"{name}.yaml"
    path.write_text(SCENARIO % violation)
    return ServeProcess(path, "hf", ["--head-timeout", str(HEAD_S), "--body-timeout", str(BODY_S), *args])


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    with _serve(tmp_path_factory.mktemp("guards"), "reject", "reject", "--max-body-bytes", str(4 << 20)) as s:
        yield s


@pytest.fixture(scope="module")
def truncating(tmp_path_factory, tiny_dir):
    with _serve(tmp_path_factory.mktemp("guards"), "truncate", "truncate", "--max-body-bytes", str(4 << 20)) as s:
        yield s


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _metric(url: str, code: str, route: str = "/v1/score") -> float:
    m = re.search(rf'^bench_requests_total{{code="{code}",route="{route}"}} (\S+)$', httpx.get(f"{url}/metrics").text,
                  re.M)
    return float(m.group(1)) if m else 0.0


def _still_good(url: str) -> None:
    r = httpx.post(f"{url}/v1/score", json=GOOD, timeout=30)
    assert r.status_code == 200, r.text
    assert len(r.json()["scores"]) == 2


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before closing `sock`; fails if it is still open after `seconds`."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except TimeoutError:
        pytest.fail(f"connection still open after {seconds} s; got {got!r}")
    except ConnectionResetError:
        pass
    return got


def test_stalled_heads_are_closed_at_the_deadline(server):
    socks = []
    for k in range(60):  # idle, half a request line, half the headers
        s = socket.create_connection(("127.0.0.1", _port(server.url)))
        s.sendall([b"", b"POST /v1/sco", b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"][k % 3])
        socks.append(s)
    t0 = time.monotonic()
    for s in socks:
        got = _closed_within(s, HEAD_S + 5)
        assert got.startswith(b"HTTP/1.1 408"), got
        s.close()
    assert time.monotonic() - t0 < HEAD_S + 5
    _still_good(server.url)


def test_a_slow_body_is_a_408_at_its_deadline(server):
    before = _metric(server.url, "408")
    s = socket.create_connection(("127.0.0.1", _port(server.url)))
    body = json.dumps(GOOD).encode()
    s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
    t0 = time.monotonic()
    got = _closed_within(s, BODY_S + 5)
    s.close()
    assert time.monotonic() - t0 >= BODY_S * 0.9
    assert got.startswith(b"HTTP/1.1 408") and b"did not arrive within 1.5 s" in got, got
    assert _metric(server.url, "408") == before + 1
    _still_good(server.url)


def test_a_client_gone_mid_body_is_a_499_without_a_traceback(server):
    before = _metric(server.url, "499")
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", _port(server.url)))
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"items\": [")
        time.sleep(0.05)
        s.close()
    deadline = time.monotonic() + 5
    while _metric(server.url, "499") < before + 5:
        assert time.monotonic() < deadline, "disconnects were not counted"
        time.sleep(0.05)
    assert _metric(server.url, "200") >= 0
    assert "Traceback" not in server.log_tail(200)
    _still_good(server.url)


@pytest.mark.parametrize("headers, status", [
    ({"content-type": "text/plain"}, 415),
    ({"content-type": "application/x-www-form-urlencoded"}, 415),
    ({}, 415),
    ({"content-type": "application/json; charset=utf-8"}, 200),
    ({"content-type": "Application/JSON"}, 200),
])
def test_bodies_must_be_json(server, headers, status):
    r = httpx.post(f"{server.url}/v1/score", content=json.dumps(GOOD).encode(), headers=headers)
    assert r.status_code == status, r.text
    if status == 415:
        assert "application/json" in r.json()["message"]


@pytest.mark.parametrize("host, status", [
    ("127.0.0.1", 200), ("localhost", 200), ("evil.example", 400), ("127.0.0.1.nip.io", 400), ("", 400),
])
def test_only_loopback_host_names_are_served(server, host, status):
    port = _port(server.url)
    r = httpx.post(f"{server.url}/v1/score", json=GOOD, headers={"host": f"{host}:{port}" if host else ""})
    assert r.status_code == status, r.text
    assert httpx.get(f"{server.url}/health", headers={"host": "evil.example"}).status_code == 400


def test_public_routes_show_no_absolute_paths(server, tiny_dir):
    for route in ("/server_info", "/get_server_info", "/get_model_info"):
        text = httpx.get(f"{server.url}{route}").text
        assert str(tiny_dir) not in text and str(Path.home()) not in text, (route, text)
        assert not re.search(r'"/[^"]', text), (route, text)  # no string value starts at the root
    assert httpx.get(f"{server.url}/get_model_info").json()["model_path"] == "tiny"


def test_text_too_long_for_the_bounds_is_refused_before_tokenizing(server):
    big = {**GOOD, "items": [" word" * 200_000]}  # 1 MB: far over 64 tokens whatever it encodes to
    t0 = time.perf_counter()
    r = httpx.post(f"{server.url}/v1/score", json=big, timeout=30)
    assert r.status_code == 400 and "characters are more than max_prompt_tokens 64" in r.json()["message"]
    assert time.perf_counter() - t0 < 5
    _still_good(server.url)


def test_long_text_is_tokenized_off_the_event_loop(truncating):
    """Truncating bounds must tokenize the whole text (its end is kept): /health must not wait
    for that, whatever the machine's speed: compared with the time the big requests take."""
    big = {**GOOD, "items": [" word" * 200_000, " red"]}

    async def main() -> tuple[list[float], float]:
        async with httpx.AsyncClient(base_url=truncating.url, timeout=120) as client:
            t0 = time.perf_counter()
            work = asyncio.gather(*[client.post("/v1/score", json=big) for _ in range(4)])
            health = []
            while not work.done():
                h0 = time.perf_counter()
                assert (await client.get("/health")).status_code == 200
                health.append(time.perf_counter() - h0)
                if len(health) >= 20:
                    break
                await asyncio.sleep(0.02)
            rs = await work
            assert all(r.status_code == 200 for r in rs), rs[0].text
            assert rs[0].json()["usage"]["prompt_tokens"] == 64 + 1  # cut to the bounds (end kept), + " red"
            return health, time.perf_counter() - t0

    health, total = asyncio.run(main())
    # all but the worst probe: one stall of a busy machine (0.27 s of 1.06 in a CI run) is not
    # the loop tokenizing, which would hold a probe behind each of the four requests' texts
    assert sorted(health)[-2 if len(health) > 1 else -1] < total / 4, (sorted(health), total)


def test_sigterm_with_stalled_clients_stops_promptly(tmp_path, tiny_dir):
    with _serve(tmp_path, "stop", "reject") as s:
        socks = [socket.create_connection(("127.0.0.1", _port(s.url))) for _ in range(100)]
        for k, sock in enumerate(socks):
            sock.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127" if k % 2 else b"")
        t0 = time.monotonic()
        assert s.stop(timeout_s=HEAD_S + BODY_S + 10) == 0  # graceful, not killed
        assert time.monotonic() - t0 < HEAD_S + BODY_S + 10
        for sock in socks:
            sock.close()
