"""The server-engine base without a server: error shapes, and when a failure means the
server is gone (ServerDied) rather than one failed request. A minimal subclass over an
in-process mock transport; the launch path is tested through the real engines' fakes."""
import asyncio
import json

import httpx
import pytest

from engines.base import EngineConfig, EngineError, PrefillRequest, RequestRejected
from engines.server import ServerDied, ServerEngine
from engines.server.client import error_message


class Echo(ServerEngine):
    name = "echo"
    label = "Echo"

    def fetch_server_info(self, client):
        return client.get("/info").json()

    async def score(self, query, items, labels):
        return (await self.post("/score", {"items": items}))["scores"]


def engine(tiny_dir, score, health=lambda r: httpx.Response(200)):
    def handler(request: httpx.Request):
        if request.url.path == "/info":
            return httpx.Response(200, json={"version": "1"})
        if request.url.path == "/health":
            return health(request)
        return score(json.loads(request.content))

    e = Echo(EngineConfig(tiny_dir, "float32", options={"url": "http://echo.test"}), transport=httpx.MockTransport(handler))
    e.start()
    return e


def ask(e):
    return asyncio.run(e.submit(PrefillRequest("r", [[1, 2]], [5, 6])))


def test_error_message_reads_the_error_shapes_servers_use():
    assert error_message({"object": "error", "message": "bad label"}, "") == "bad label"  # SGLang
    assert error_message({"error": {"message": "no beams", "code": 400}}, "") == "no beams"  # vLLM, OpenAI
    assert error_message({"detail": "Not Found"}, "") == "Not Found"  # FastAPI
    assert error_message(None, "plain text body") == "plain text body"


def test_a_5xx_from_a_server_whose_health_fails_is_server_died(tiny_dir):
    """vLLM answers 500 when its engine core dies, then /health answers 503."""
    calls = []

    def score(body):
        calls.append(body)
        return httpx.Response(500, json={"error": {"message": "EngineCore encountered an issue"}})

    e = engine(tiny_dir, score, health=lambda r: httpx.Response(503))
    with pytest.raises(ServerDied, match="unhealthy.*HTTP 503"):
        ask(e)
    with pytest.raises(ServerDied):  # later requests fail fast, without reaching the server
        ask(e)
    assert len(calls) == 1


def test_a_5xx_while_health_is_slow_is_one_failed_request(tiny_dir):
    def slow(request):
        raise httpx.ReadTimeout("busy", request=request)

    answers = iter([httpx.Response(500, json={"message": "out of memory"}), httpx.Response(200, json={"scores": [[1.0]]})])
    e = engine(tiny_dir, lambda body: next(answers), health=slow)
    with pytest.raises(EngineError, match="HTTP 500.*out of memory") as err:
        ask(e)
    assert not isinstance(err.value, ServerDied)
    assert ask(e).scores == [[1.0]]


def test_a_4xx_is_a_rejection_of_that_request(tiny_dir):
    e = engine(tiny_dir, lambda body: httpx.Response(400, json={"error": {"message": "bad field"}}))
    with pytest.raises(RequestRejected, match="Echo /score refused the request \\(HTTP 400\\): bad field"):
        ask(e)


@pytest.mark.parametrize("options, says", [
    ({"startup_timeout_s": float("inf")}, "startup_timeout_s: Input should be a finite number"),  # waited forever
    ({"timeout_s": float("nan")}, "timeout_s: Input should be a finite number"),
    ({"timeout_s": 1e9}, "timeout_s: Input should be less than or equal to 86400"),
    ({"kv_cache_gib": float("inf")}, "kv_cache_gib: Input should be a finite number"),
    ({"server_args": 5}, "server_args: give the arguments as one string or a list, got int"),  # was a TypeError
    ({"url": "not a url"}, "url: 'not a url': give the server's URL"),  # was skipped at run time
    ({"url": "http://[::1"}, "url: 'http://[::1' is not a URL"),  # was an InvalidURL when the engine was made
    ({"url": "http://h:99999"}, "is not a URL (Port out of range"),
])
def test_server_options_refuse_hostile_values(options, says):
    from engines.vllm.engine import VLLMOptions

    with pytest.raises(ValueError) as e:
        VLLMOptions.parse(options, "vllm")
    assert says in str(e.value) and str(e.value).startswith("vllm options: ")
    assert VLLMOptions.parse({"server_args": ["--tp", 2], "url": "http://127.0.0.1:1"}, "vllm").server_args == ("--tp", "2")
