"""`bench serve`: any engine behind SGLang-compatible HTTP routes, on uvicorn.

Routes: `POST /v1/score`, `POST /generate` (bodies in `harness.serve.api`), `GET /health`,
`GET /metrics` (Prometheus: requests by status, latency, queue depth, samples per request,
engine stage times, the engine's own counters such as batches, process memory),
`GET /get_model_info`, `GET /server_info` (also `/get_server_info`, as SGLang has both).

This module holds the routes and the serving loop; the engine comes from `harness.serve.engine`,
the request's checks on its way in from `harness.serve.guards`, `/metrics` from `harness.serve.metrics`.

Robustness, in the order a request meets it:
- deadlines: a connection must send a whole request head within `head_timeout_s` (else a
  408 and the connection is closed, `harness.serve.deadline`), and the body within
  `body_timeout_s` (a 408);
- host: a Host header outside `allowed_hosts` (loopback names by default) is a 400, so a web
  page cannot drive the server through DNS rebinding;
- content type: a POST body must be `application/json` (a 415), so a page cannot send one
  cross-origin without a preflight;
- body size: a declared or streamed body over `max_body_bytes` is a 413, unread;
- validation: strict bodies and the engines' shared request check (`engines.validate`)
  against the scenario's bounds, a 400 naming the field; text too long for the bounds is
  refused before it is tokenized, and tokenizing runs in worker threads, off the event loop;
- admission: at most `concurrency` requests in the engine and `max_queue` waiting; one more
  is a 429 at once, so latency stays bounded instead of growing with the backlog;
- isolation: an engine failure is that request's 500, nothing else's;
- disconnects: a client that goes away cancels its request (a queued one never reaches the
  engine; a running one's answer is dropped); counted as 499, mid-body or later;
- shutdown (SIGINT/SIGTERM): stop accepting, finish what is in flight, then stop the engine.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import harness
from engines.base import Engine, RequestRejected
from engines.registry import create_engine
from harness.serve.api import ApiError, GenerateBody, ScoreBody, Translated, Translator, parse_body
from harness.serve.deadline import with_head_timeout
from harness.serve.engine import engine_setup, public
from harness.serve.guards import Admission, ClientGone, read_body, require_json, until_disconnect
from harness.serve.hosts import LOOPBACK_HOSTS
from harness.serve.metrics import ServerMetrics


@dataclass(frozen=True)
class ServeOptions:
    concurrency: int = 4  # requests inside the engine at once
    max_queue: int = 64  # requests waiting for a slot; past this a request gets 429
    max_body_bytes: int = 1 << 20
    graceful_timeout_s: float = 30.0  # how long shutdown waits for in-flight requests
    head_timeout_s: float = 10.0  # to send a request's line and headers
    body_timeout_s: float = 30.0  # to send its body
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS  # Host header names served ("*": any)
    text_threads: int = 2  # threads that parse and tokenize bodies

    def __post_init__(self):
        if self.concurrency < 1 or self.max_queue < 0 or self.max_body_bytes < 1 or self.text_threads < 1:
            raise ValueError("need concurrency >= 1, max_queue >= 0, max_body_bytes >= 1")
        for name in ("graceful_timeout_s", "head_timeout_s", "body_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds")
        if not self.allowed_hosts:
            raise ValueError("allowed_hosts: give at least one host name (or '*')")


class Server:
    """The route handlers around one started engine."""

    def __init__(self, engine: Engine, translator: Translator, options: ServeOptions, info: dict[str, Any],
                 live_info: Callable[[], dict[str, Any]] | None = None):
        self.engine, self.translator, self.options, self.info = engine, translator, options, info
        self.live_info = live_info  # more of /server_info, read at each call (a Ray replica: the placement)
        self.admission = Admission(options.concurrency, options.max_queue)
        self.metrics = ServerMetrics(self.admission, engine)
        self._ids = itertools.count()
        self._text = ThreadPoolExecutor(options.text_threads, thread_name_prefix="serve-text")

    async def _run(self, request: Request, route: str, translate, answer) -> Response:
        t0, code, t, result = time.perf_counter(), 200, None, None
        try:
            require_json(request)
            raw = await read_body(request, self.options.max_body_bytes, self.options.body_timeout_s)
            rid = f"req-{next(self._ids)}"
            t = await asyncio.get_running_loop().run_in_executor(self._text, translate, raw, rid)  # off the loop
            result = await until_disconnect(request.receive, self._admitted(t))
            return JSONResponse(answer(result, t, time.perf_counter() - t0))
        except ApiError as e:
            code = e.status
            return JSONResponse(e.payload(), status_code=e.status)
        except (ClientGone, ClientDisconnect):  # gone mid-body, or while its answer was made
            code = 499
            return Response(status_code=499)
        finally:
            self.metrics.answered(route, code, time.perf_counter() - t0, t, result)

    async def _admitted(self, t: Translated) -> Any:
        async with self.admission.slot():
            try:
                return await self.engine.submit(t.request)
            except RequestRejected as e:
                raise ApiError(400, str(e)) from None
            except Exception as e:  # one request's failure is that request's answer
                raise ApiError(500, f"engine failed: {type(e).__name__}: {e}") from None

    async def score(self, request: Request) -> Response:
        tr = self.translator
        return await self._run(request, "/v1/score", lambda raw, rid: tr.score(parse_body(ScoreBody, raw), rid),
                               lambda res, t, _s: tr.score_answer(res, t))

    async def generate(self, request: Request) -> Response:
        tr = self.translator
        return await self._run(request, "/generate", lambda raw, rid: tr.generate(parse_body(GenerateBody, raw), rid),
                               tr.generate_answer)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "running": self.admission.running, "queued": self.admission.waiting})

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": self.info.get("model"), "is_generation": True})

    async def server_info(self, request: Request) -> Response:
        live = await asyncio.to_thread(self.live_info) if self.live_info else {}
        return JSONResponse({**self.info, **live})

    def app(self) -> Starlette:
        routes = [Route("/v1/score", self.score, methods=["POST"]), Route("/generate", self.generate, methods=["POST"]),
                  Route("/health", self.health, methods=["GET"]), Route("/metrics", self.prometheus, methods=["GET"]),
                  Route("/get_model_info", self.model_info, methods=["GET"]),
                  Route("/get_server_info", self.server_info, methods=["GET"]),
                  Route("/server_info", self.server_info, methods=["GET"])]
        hosts = [Middleware(TrustedHostMiddleware, allowed_hosts=list(self.options.allowed_hosts))]
        return Starlette(routes=routes, middleware=hosts, exception_handlers={HTTPException: _http_error})

    def close(self) -> None:
        self._text.shutdown(wait=False, cancel_futures=True)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return JSONResponse(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").payload(),
                        status_code=exc.status_code)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 picks a free one (read it back with getsockname)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP: asyncio sets NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def build_server(scenario, engine_name: str, options: ServeOptions, *, device: str | None = None,
                 engine_options: dict | None = None, log: Callable[[str], None] = print) -> Server:
    """Resolve the scenario's model, start the engine with the scenario's bounds, and wrap it."""

    setup = engine_setup(scenario, engine_name, device=device, engine_options=engine_options, log=log)
    cfg = setup.config
    engine = create_engine(setup.name, cfg)
    log(f"starting engine {engine_name} on {cfg.device} ...")
    engine.start()
    info = {"version": f"bench-serve {harness.__version__}", "engine": engine.describe().to_dict(), "model": scenario.model,
            "scenario": scenario.name, "bounds": cfg.bounds.__dict__, "serve": options.__dict__}
    return Server(engine, setup.translator, options, public(info))


def run(server: Server, sock: socket.socket, on_ready: Callable[[], None] = lambda: None) -> None:
    """Serve on `sock` until SIGINT/SIGTERM; in-flight requests finish; then stop the engine."""
    import uvicorn

    server.info.setdefault("deployment", {"server": "bench serve", "replicas": 1,
                                          "placement": [{"host": socket.gethostname(), "pid": os.getpid()}]})

    config = uvicorn.Config(server.app(), log_level="warning", access_log=False, lifespan="off",
                            http=with_head_timeout(server.options.head_timeout_s),
                            timeout_graceful_shutdown=server.options.graceful_timeout_s)
    uv = uvicorn.Server(config)

    async def main() -> None:
        serving = asyncio.create_task(uv.serve(sockets=[sock]))
        while not uv.started and not serving.done():
            await asyncio.sleep(0.02)
        if uv.started:
            on_ready()
        await serving

    # uvicorn re-raises the signal that stopped it once it has drained; answer it with a
    # no-op so the engine is stopped and the process exits 0 after a graceful shutdown
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        asyncio.run(main())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.close()
        server.engine.stop()
