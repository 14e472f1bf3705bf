"""`bench serve`: any engine behind SGLang-compatible HTTP routes, on uvicorn.

Routes: `POST /v1/score`, `POST /generate` (bodies in `harness.serve.api`), `GET /health`,
`GET /metrics` (Prometheus: requests by status, latency, queue depth, samples per request,
engine stage times, the engine's own counters such as batches, process memory),
`GET /get_model_info`, `GET /server_info` (also `/get_server_info`, as SGLang has both).

Robustness, in the order a request meets it:
- body size: a declared or streamed body over `max_body_bytes` is a 413, unread;
- validation: strict bodies and the scenario's bounds, a 400 with a message;
- admission: at most `concurrency` requests in the engine and `max_queue` waiting; one more
  is a 429 at once, so latency stays bounded instead of growing with the backlog;
- isolation: an engine failure is that request's 500, nothing else's;
- disconnects: a client that goes away cancels its request (a queued one never reaches the
  engine; a running one's answer is dropped);
- shutdown (SIGINT/SIGTERM): stop accepting, finish what is in flight, then stop the engine.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engines.base import Engine, RequestRejected
from harness.serve.api import ApiError, GenerateBody, ScoreBody, Translated, Translator, parse_body

LATENCY_BUCKETS = (.001, .0025, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class ServeOptions:
    concurrency: int = 4  # requests inside the engine at once
    max_queue: int = 64  # requests waiting for a slot; past this a request gets 429
    max_body_bytes: int = 1 << 20
    graceful_timeout_s: float = 30.0  # how long shutdown waits for in-flight requests

    def __post_init__(self):
        if self.concurrency < 1 or self.max_queue < 0 or self.max_body_bytes < 1:
            raise ValueError("need concurrency >= 1, max_queue >= 0, max_body_bytes >= 1")


class Admission:
    """A bounded queue in front of the engine: `concurrency` slots and `max_queue` waiters."""

    def __init__(self, concurrency: int, max_queue: int):
        self.concurrency, self.max_queue = concurrency, max_queue
        self._slots = asyncio.Semaphore(concurrency)
        self.waiting = 0
        self.running = 0

    @contextlib.asynccontextmanager
    async def slot(self):
        if self.running + self.waiting >= self.concurrency + self.max_queue:
            raise ApiError(429, f"server busy: {self.running} running and {self.waiting} queued "
                                f"(queue bound {self.max_queue}); retry later")
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()


class ServerMetrics:
    """Prometheus metrics in a registry of their own (several apps may share a process)."""

    def __init__(self, admission: Admission, engine: Engine):
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        r.register(_EngineStats(engine))
        self.requests = Counter("bench_requests", "Requests answered, by route and HTTP status",
                                ["route", "code"], registry=r)
        self.latency = Histogram("bench_request_latency_seconds", "Time to answer a successful request",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.samples = Histogram("bench_request_samples", "Samples (or beams) per successful request",
                                 ["route"], buckets=SIZE_BUCKETS, registry=r)
        self.stage = Histogram("bench_engine_stage_seconds", "Per-stage times the engine reports",
                               ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        Gauge("bench_queue_depth", "Requests waiting for an engine slot",
              registry=r).set_function(lambda: admission.waiting)
        Gauge("bench_in_flight", "Requests inside the engine", registry=r).set_function(lambda: admission.running)

    def answered(self, route: str, code: int, seconds: float, t: Translated | None, result: Any) -> None:
        self.requests.labels(route, str(code)).inc()
        if code != 200 or t is None:
            return
        self.latency.labels(route).observe(seconds)
        req = t.request
        self.samples.labels(route).observe(req.num_samples if route == "/v1/score" else req.beam_width)
        for name, ms in (getattr(result, "stages", None) or {}).items():
            self.stage.labels(name).observe(ms / 1e3)


class _EngineStats:
    """Numbers an engine keeps in a `stats` dict (the bounded engine: requests, batches,
    largest_batch; mean batch size = requests / batches), read at each scrape."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        fam = GaugeMetricFamily("bench_engine_stat", "Counters the engine reports about itself", labels=["name"])
        for name, value in (getattr(self.engine, "stats", None) or {}).items():
            if isinstance(value, (int, float)):
                fam.add_metric([name], float(value))
        yield fam


class ClientGone(Exception):
    pass


async def until_disconnect(receive: Callable[[], Awaitable[dict]], work: Awaitable[Any]) -> Any:
    """Await `work`; if the client disconnects first, cancel it and raise ClientGone. Call
    after the body has been read: the server's `receive` then only reports the disconnect."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise ClientGone()


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body of {declared} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class Server:
    """The route handlers around one started engine."""

    def __init__(self, engine: Engine, translator: Translator, options: ServeOptions, info: dict[str, Any]):
        self.engine, self.translator, self.options, self.info = engine, translator, options, info
        self.admission = Admission(options.concurrency, options.max_queue)
        self.metrics = ServerMetrics(self.admission, engine)
        self._ids = itertools.count()

    async def _run(self, request: Request, route: str, translate, answer) -> Response:
        t0, code, t, result = time.perf_counter(), 200, None, None
        try:
            raw = await read_body(request, self.options.max_body_bytes)
            t = translate(raw, f"req-{next(self._ids)}")
            result = await until_disconnect(request.receive, self._admitted(t))
            return JSONResponse(answer(result, t, time.perf_counter() - t0))
        except ApiError as e:
            code = e.status
            return JSONResponse(e.payload(), status_code=e.status)
        except ClientGone:
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
        return JSONResponse({"model_path": self.info.get("model_dir"), "is_generation": True})

    async def server_info(self, request: Request) -> Response:
        return JSONResponse(self.info)

    def app(self) -> Starlette:
        routes = [Route("/v1/score", self.score, methods=["POST"]), Route("/generate", self.generate, methods=["POST"]),
                  Route("/health", self.health, methods=["GET"]), Route("/metrics", self.prometheus, methods=["GET"]),
                  Route("/get_model_info", self.model_info, methods=["GET"]),
                  Route("/get_server_info", self.server_info, methods=["GET"]),
                  Route("/server_info", self.server_info, methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


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
    import harness
    from engines.registry import create_engine
    from harness.presets import resolve_model
    from harness.runner import engine_config
    from harness.scenario import BeamTask, EngineSpec
    from harness.workload import item_codes, load_tokenizer

    model_dir = resolve_model(scenario.model, log)
    by_name = {s.name: s for s in scenario.engines}
    spec = by_name.get(engine_name, EngineSpec(name=engine_name))
    if engine_options:
        spec = EngineSpec(name=engine_name, **{**spec.options, **engine_options})
    cfg = engine_config(scenario, spec, model_dir, device or scenario.device)
    tokenizer = load_tokenizer(model_dir)
    task, allowed = scenario.task, None
    if isinstance(task, BeamTask) and task.item_codes is not None:
        c = task.item_codes
        allowed = item_codes(tokenizer, c.count, c.length, c.seed)
    translator = Translator(tokenizer, _vocab_size(model_dir, tokenizer), cfg.bounds, allowed, scenario.model)
    engine = create_engine(engine_name, cfg)
    log(f"starting engine {engine_name} on {cfg.device} ...")
    engine.start()
    info = {"version": f"bench-serve {harness.__version__}", "engine": engine.describe(), "model": scenario.model,
            "model_dir": model_dir, "scenario": scenario.name, "bounds": cfg.bounds.__dict__, "serve": options.__dict__}
    return Server(engine, translator, options, info)


def _vocab_size(model_dir: str, tokenizer: Any) -> int:
    path = Path(model_dir) / "config.json"
    if path.exists():
        return int(json.loads(path.read_text()).get("vocab_size") or len(tokenizer))
    return len(tokenizer)


def run(server: Server, sock: socket.socket, on_ready: Callable[[], None] = lambda: None) -> None:
    """Serve on `sock` until SIGINT/SIGTERM; in-flight requests finish; then stop the engine."""
    import uvicorn

    config = uvicorn.Config(server.app(), log_level="warning", access_log=False, lifespan="off",
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
        server.engine.stop()
