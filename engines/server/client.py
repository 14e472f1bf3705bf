"""The base of the engines that are async HTTP clients of a real inference server (SGLang,
vLLM): options, connect-or-launch, the tokenizer, pooled HTTP, and the mapping of HTTP
failures to the engine's error types.

Text samples and string labels are tokenized here with the model's tokenizer, as in every
engine, and checked by engines/validate.py; the server gets token ids, so it scores exactly
the tokens the other engines score. A subclass says how to launch its server, what its routes are and
how its bodies look.

Failures: a 4xx is that request's RequestRejected; a 5xx, a timeout or a dropped connection
is that request's EngineError; a server that is gone (its process exited, or it no longer
answers `/health` with 200) is ServerDied, an EngineDied: the harness ends this engine's run.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engines.base import (Beam, BeamRequest, BeamResult, Description, Engine, EngineConfig, EngineDied, EngineError,
                          EngineUnavailable, PrefillRequest, PrefillResult, Request, RequestRejected, Result)
from engines.server.process import LaunchSpec, LaunchedServer, free_port, split_args
from engines.server.venv import ManagedVenv, cache_dir
from engines.validate import Limits, RequestChecker


MAX_WAIT_S = 24 * 3600.0  # start-up and per-request timeouts: a day at most (inf would wait forever)


class ServerDied(EngineDied):
    """The server is gone: every further request would fail; stop the run."""


class ServerOptions(BaseModel):
    """EngineConfig.options shared by the server engines (they come from a scenario file)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    url: Optional[str] = None
    launch: Optional[bool] = None
    python: Optional[str] = None
    server_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: Optional[int] = Field(default=None, ge=1, le=65535)
    startup_timeout_s: float = Field(default=300.0, gt=0, le=MAX_WAIT_S)
    per_sample: bool = False
    timeout_s: float = Field(default=120.0, gt=0, le=MAX_WAIT_S)
    max_connections: int = Field(default=512, ge=1, le=65536)
    log_path: Optional[str] = None

    @field_validator("server_args", mode="before")
    @classmethod
    def _split(cls, v: Any) -> tuple[str, ...]:
        if v is not None and not isinstance(v, (str, list, tuple)):
            raise ValueError(f"give the arguments as one string or a list, got {type(v).__name__}")
        return split_args(v)

    @field_validator("url")
    @classmethod
    def _url(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        try:
            parts = urlsplit(v)
            parts.port  # noqa: B018 - raises on a port that is not one
        except ValueError as e:
            raise ValueError(f"{v!r} is not a URL ({e})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{v!r}: give the server's URL, e.g. http://127.0.0.1:30000")
        return v

    @model_validator(mode="after")
    def _one_mode(self) -> "ServerOptions":
        if self.url and self.launch:
            raise ValueError("give either url (connect to a server) or launch: true, not both")
        return self

    @classmethod
    def parse(cls, options: dict[str, Any], engine: str) -> "ServerOptions":
        try:
            return cls(**options)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'options'}: "
                                 f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors())
            raise ValueError(f"{engine} options: {problems} (allowed: {', '.join(cls.model_fields)})") from None

    @property
    def launches(self) -> bool:
        return not self.url if self.launch is None else self.launch


class ServerEngine(Engine):
    """An engine answered by a server it connects to (`url`) or launches from `venv`."""

    label = "server"  # the server's name in messages, e.g. "SGLang"
    options_type: type[ServerOptions] = ServerOptions
    takes_query_requests = True  # `score` gets the query apart from the items
    venv: ManagedVenv  # where a launched server's interpreter lives
    setup_command = ""  # the CLI command that builds `venv`, for messages
    constraint_refusal = "this server cannot constrain beam search to allowed item codes"

    def __init__(self, config: EngineConfig, transport: httpx.MockTransport | None = None):
        super().__init__(config)
        self.options = self.options_type.parse(config.options, self.name)
        self._transport = transport  # tests: one transport serving both the sync and async client
        self._server: LaunchedServer | None = None
        self.url = (self.options.url or "").rstrip("/")
        self._server_info: dict[str, Any] = {}
        self._tokenizer = None
        self._checker: RequestChecker | None = None
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._died: str | None = None

    # -- subclass hooks ------------------------------------------------------------------

    def launch_command(self, port: int) -> list[str]:
        raise NotImplementedError

    def launch_env(self) -> dict[str, str]:
        return dict(os.environ)

    def fetch_server_info(self, client: httpx.Client) -> dict[str, Any]:
        """What describe() reports of the server (version, settings), read at start."""
        raise NotImplementedError

    def check_model(self) -> None:
        """Raise EngineUnavailable if the server cannot serve this model (before a launch)."""

    async def score(self, query: list[int], items: list[list[int]], labels: list[int]) -> list[list[float]]:
        """Label probabilities of each sample query + item (token ids; `query` is empty for a
        request of plain samples), in order: one server call."""
        raise NotImplementedError

    async def beam_search(self, prompt: list[int], beam_width: int, decode_steps: int) -> list[Beam]:
        """The server's beam search over `prompt`, best first."""
        raise NotImplementedError

    # -- availability and lifecycle ------------------------------------------------------

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        cls.options_type.parse(options, cls.name)

    @classmethod
    def check_available(cls, config: EngineConfig) -> None:
        try:
            opts = cls.options_type.parse(config.options, cls.name)
        except (TypeError, ValueError) as e:
            raise EngineUnavailable(f"{cls.name}: {e}") from e
        if not opts.launches:
            try:
                httpx.get(f"{opts.url.rstrip('/')}/health", timeout=5).raise_for_status()
            except httpx.HTTPError as e:
                raise EngineUnavailable(f"no healthy {cls.label} server at {opts.url} ({e})") from e
            return
        python = cls.python_path(opts)
        if not python.exists():
            raise EngineUnavailable(f"no {cls.label} environment at {python} (run `{cls.setup_command}`, "
                                    f"or give option url or python)")
        if not opts.python and cls.venv.read_marker(cls.venv.default_dir()) is None:
            raise EngineUnavailable(f"{cls.label} environment at {cls.venv.default_dir()} is incomplete "
                                    f"(re-run `{cls.setup_command}`)")

    @classmethod
    def python_path(cls, opts: ServerOptions) -> Path:
        if opts.python:
            return Path(opts.python).expanduser()
        return cls.venv.default_dir() / "bin" / "python"

    def start(self) -> None:
        self._load_tokenizer()  # first: it fails in a second, a launch takes a minute
        if self.options.launches:
            self.check_model()
            self._server = LaunchedServer(self._launch_spec())
            self._server.start()
            self.url = self._server.url
        try:
            with httpx.Client(base_url=self.url, timeout=30, transport=self._transport) as client:
                self._server_info = self.fetch_server_info(client)
        except httpx.HTTPError as e:
            self.stop()
            raise EngineUnavailable(f"{self.label} server at {self.url} does not answer: {e}") from e
        except BaseException:
            self.stop()
            raise

    def _launch_spec(self) -> LaunchSpec:
        port = self.options.port or free_port(self.options.host)
        log_path = (Path(self.options.log_path) if self.options.log_path else
                    cache_dir() / f"{self.name}-logs" / f"server-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log")
        return LaunchSpec(label=self.label, command=tuple(self.launch_command(port)), host=self.options.host,
                          port=port, log_path=log_path, startup_timeout_s=self.options.startup_timeout_s,
                          env=self.launch_env())

    def _load_tokenizer(self) -> None:
        from transformers import AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.config.model_dir))
        except (OSError, ValueError) as e:
            raise EngineUnavailable(f"cannot load the tokenizer of {self.config.model_dir}: {e}") from e
        self._checker = RequestChecker(Limits.for_model(self.config.model_dir, self.config.bounds), self._tokenizer)

    def resize(self, bounds) -> bool:
        """The server plans nothing from the bounds (they are checked here, client side)."""
        self.config = replace(self.config, bounds=bounds)
        self._checker = RequestChecker(Limits.for_model(self.config.model_dir, bounds), self._tokenizer)
        return True

    def stop(self) -> None:
        self._client = None  # bound to its event loop, which may be gone: let it be collected
        if self._server is not None:
            self._server.stop()
            self._server = None

    def describe(self) -> Description:
        return replace(super().describe(), mode="launch" if self.options.launches else "connect").with_details(
            url=self.url, per_sample=self.options.per_sample)

    # -- requests -------------------------------------------------------------------------

    async def submit(self, request: Request) -> Result:
        if self._died:
            raise ServerDied(self._died)
        if isinstance(request, PrefillRequest):
            return await self._prefill(request)
        if isinstance(request, BeamRequest):
            return await self._beam(request)
        raise RequestRejected(f"{self.name} engine cannot serve a {type(request).__name__}")

    async def _prefill(self, request: PrefillRequest) -> PrefillResult:
        checked = self._checker.prefill(request)  # a query request keeps its query apart
        query, items, labels = checked.query, checked.items, checked.labels
        t0 = time.perf_counter()
        if self.options.per_sample:
            parts = await gather_in_order([self.score(query, [item], labels) for item in items])
            scores = [row for part in parts for row in part]
        else:
            scores = await self.score(query, items, labels)
        return PrefillResult(id=request.id, scores=scores, stages={"http": (time.perf_counter() - t0) * 1e3})

    async def _beam(self, request: BeamRequest) -> BeamResult:
        if request.allowed is not None:
            raise RequestRejected(self.constraint_refusal)
        checked = self._checker.beam(request)
        t0 = time.perf_counter()
        beams = await self.beam_search(checked.prompt, checked.beam_width, checked.decode_steps)
        return BeamResult(id=request.id, beams=beams, stages={"http": (time.perf_counter() - t0) * 1e3})

    # -- HTTP ----------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        """One client per event loop: a pooled connection cannot move between loops."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            limits = httpx.Limits(max_connections=self.options.max_connections,
                                  max_keepalive_connections=self.options.max_connections)
            self._client = httpx.AsyncClient(base_url=self.url, timeout=self.options.timeout_s,
                                             limits=limits, transport=self._transport)
            self._client_loop = loop
        return self._client

    async def post(self, route: str, body: dict[str, Any]) -> Any:
        """POST `body`; -> the JSON answer. Raises as the module docstring says."""
        if self._died:
            raise ServerDied(self._died)
        try:
            r = await self._http().post(route, json=body)
        except httpx.TimeoutException as e:
            await self._check_alive(e)
            raise EngineError(f"{self.label} {route} timed out after {self.options.timeout_s:g} s "
                              f"(option timeout_s)") from e
        except httpx.HTTPError as e:
            await self._check_alive(e)
            raise EngineError(f"{self.label} {route} failed: {type(e).__name__}: {e}") from e
        try:
            payload = r.json()
        except ValueError:
            payload = None
        if 400 <= r.status_code < 500:
            raise RequestRejected(f"{self.label} {route} refused the request (HTTP {r.status_code}): "
                                  f"{error_message(payload, r.text)}")
        if r.status_code >= 500:
            await self._check_alive(None)
            raise EngineError(f"{self.label} {route} failed (HTTP {r.status_code}): "
                              f"{error_message(payload, r.text)}")
        if payload is None:
            raise EngineError(f"{self.label} {route} answered HTTP {r.status_code} with a body that is not JSON")
        return payload

    async def _check_alive(self, cause: Exception | None) -> None:
        """Raise ServerDied if the server is gone: its process exited, or (after a failed
        connection or a 5xx) `/health` is refused or answers other than 200."""
        if self._server is not None:
            for _ in range(20):  # a crashing server drops connections just before it exits
                if not self._server.alive():
                    self._died = (f"{self.label} server (pid {self._server.pid}) exited with code "
                                  f"{self._server.returncode}; {self._server.log_excerpt()}")
                    raise ServerDied(self._died) from cause
                await asyncio.sleep(0.05)
        if isinstance(cause, httpx.TimeoutException):
            return  # slow, not gone
        try:
            r = await self._http().get("/health", timeout=5)
        except httpx.TimeoutException:
            return  # busy: inconclusive
        except httpx.HTTPError as e:
            self._died = f"{self.label} server at {self.url} no longer answers ({type(e).__name__}: {e})"
        else:
            if r.status_code == 200:
                return
            self._died = f"{self.label} server at {self.url} is unhealthy (/health answers HTTP {r.status_code})"
        if self._server is not None:
            self._died += f"; {self._server.log_excerpt()}"
        raise ServerDied(self._died) from cause


def error_message(payload: Any, fallback: str) -> str:
    """The message of an error answer: {"message": ...} (SGLang's OpenAI routes),
    {"error": {"message": ...}} (vLLM, OpenAI), {"error": "..."} or {"detail": ...} (FastAPI)."""
    if isinstance(payload, dict):
        if isinstance(payload.get("message"), str):
            return payload["message"]
        err = payload.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        if isinstance(payload.get("detail"), (str, list)):
            return str(payload["detail"])
    return fallback[:500]


async def gather_in_order(coros: list) -> list:
    """Run concurrently; results in input order; on the first failure cancel the rest."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
