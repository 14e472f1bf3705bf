"""The `sglang` engine: an async HTTP client of a real SGLang server, which it either
connects to (`url`) or launches from SGLang's own environment (see `env.py`).

Text samples and string labels are tokenized here with the model's tokenizer, as in every
engine, and the bounds applied; the server gets token ids, so it scores exactly the tokens
the other engines score. What SGLang does with them is in `protocol.py`.

Options (EngineConfig.options):
  url: str                 connect to a running server (no launch)
  launch: bool             launch a server (default when no url is given)
  python: str              interpreter of the SGLang env (default: the managed env)
  server_args: list|str    extra `launch_server` arguments, appended last (they override ours)
  host, port               where a launched server listens (default 127.0.0.1, a free port)
  startup_timeout_s: 300   how long a launched server may take to become healthy
  per_sample: false        one /v1/score call per sample (a query request: the query and one
                           item per call), concurrently, re-assembled in order
  timeout_s: 120           per HTTP request
  max_connections: 512     HTTP connection pool size
  log_path: str            launched server's log (default under the cache folder)
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Optional

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engines.base import (BeamRequest, BeamResult, Engine, EngineConfig, EngineDied, EngineError,
                          EngineUnavailable, PrefillRequest, PrefillResult, Request,
                          RequestRejected, Result)
from engines.sglang import protocol
from engines.sglang.env import cache_dir, default_env_dir, env_python, read_marker
from engines.sglang.server import LaunchSpec, LaunchedServer, free_port, log_tail, split_args
from engines.validate import Limits, RequestChecker


class ServerDied(EngineDied):
    """The SGLang server is gone: every further request would fail; stop the run."""


class SGLangOptions(BaseModel):
    """EngineConfig.options of the sglang engine (they come from a scenario file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    url: Optional[str] = None
    launch: Optional[bool] = None
    python: Optional[str] = None
    server_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: Optional[int] = Field(default=None, ge=1, le=65535)
    startup_timeout_s: float = Field(default=300.0, gt=0)
    per_sample: bool = False
    timeout_s: float = Field(default=120.0, gt=0)
    max_connections: int = Field(default=512, ge=1)
    log_path: Optional[str] = None

    @field_validator("server_args", mode="before")
    @classmethod
    def _split(cls, v: Any) -> tuple[str, ...]:
        return split_args(v)

    @model_validator(mode="after")
    def _one_mode(self) -> "SGLangOptions":
        if self.url and self.launch:
            raise ValueError("give either url (connect to a server) or launch: true, not both")
        return self

    @classmethod
    def parse(cls, options: dict[str, Any]) -> "SGLangOptions":
        try:
            return cls(**options)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'options'}: {err['msg']}"
                                 for err in e.errors())
            raise ValueError(f"sglang options: {problems} (allowed: {', '.join(cls.model_fields)})") from None

    @property
    def launches(self) -> bool:
        return not self.url if self.launch is None else self.launch

    def python_path(self) -> Path:
        return Path(self.python).expanduser() if self.python else env_python(default_env_dir())


class SGLangEngine(Engine):
    name = "sglang"
    takes_query_requests = True

    def __init__(self, config: EngineConfig, transport: httpx.MockTransport | None = None):
        super().__init__(config)
        self.options = SGLangOptions.parse(config.options)
        self._transport = transport  # tests: one transport serving both the sync and async client
        self._server: LaunchedServer | None = None
        self.url = (self.options.url or "").rstrip("/")
        self._server_info: dict[str, Any] = {}
        self._tokenizer = None
        self._checker: RequestChecker | None = None
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._died: str | None = None

    # -- availability and lifecycle ------------------------------------------------------

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        SGLangOptions.parse(options)

    @classmethod
    def check_available(cls, config: EngineConfig) -> None:
        try:
            opts = SGLangOptions.parse(config.options)
        except (TypeError, ValueError) as e:
            raise EngineUnavailable(f"sglang: {e}") from e
        if not opts.launches:
            try:
                httpx.get(f"{opts.url.rstrip('/')}/health", timeout=5).raise_for_status()
            except httpx.HTTPError as e:
                raise EngineUnavailable(f"no healthy SGLang server at {opts.url} ({e})") from e
            return
        python = opts.python_path()
        if not python.exists():
            raise EngineUnavailable(f"no SGLang environment at {python} (run `bench sglang setup`, "
                                    f"or give option url or python)")
        if not opts.python and read_marker(default_env_dir()) is None:
            raise EngineUnavailable(f"SGLang environment at {default_env_dir()} is incomplete "
                                    f"(re-run `bench sglang setup`)")

    def start(self) -> None:
        self._load_tokenizer()  # first: it fails in a second, a launch takes a minute
        if self.options.launches:
            self._server = LaunchedServer(self._launch_spec())
            self._server.start()
            self.url = self._server.url
        try:
            self._server_info = self._fetch_server_info()
        except BaseException:
            self.stop()
            raise

    def _launch_spec(self) -> LaunchSpec:
        port = self.options.port or free_port(self.options.host)
        log_path = (Path(self.options.log_path) if self.options.log_path else
                    cache_dir() / "sglang-logs" / f"server-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log")
        return LaunchSpec(python=self.options.python_path(), model_dir=Path(self.config.model_dir),
                          dtype=self.config.dtype, device=self.config.device, host=self.options.host,
                          port=port, extra_args=self.options.server_args, log_path=log_path,
                          startup_timeout_s=self.options.startup_timeout_s)

    def _fetch_server_info(self) -> dict[str, Any]:
        with httpx.Client(base_url=self.url, timeout=30, transport=self._transport) as client:
            for route in ("/server_info", "/get_server_info"):  # 0.5.23 has both; older only the second
                try:
                    r = client.get(route)
                except httpx.HTTPError as e:
                    raise EngineUnavailable(f"SGLang server at {self.url} does not answer: {e}") from e
                if r.status_code == 200:
                    return r.json()
        raise EngineUnavailable(f"SGLang server at {self.url} has no server-info route (HTTP {r.status_code})")

    def _load_tokenizer(self) -> None:
        """Text samples and string labels are tokenized here, as every engine does, so the
        server scores exactly the same tokens."""
        from transformers import AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.config.model_dir))
        except (OSError, ValueError) as e:
            raise EngineUnavailable(f"cannot load the tokenizer of {self.config.model_dir}: {e}") from e
        self._checker = RequestChecker(Limits.for_model(self.config.model_dir, self.config.bounds), self._tokenizer)

    def stop(self) -> None:
        self._client = None  # bound to its event loop, which may be gone: let it be collected
        if self._server is not None:
            self._server.stop()
            self._server = None

    def describe(self) -> dict[str, Any]:
        info = self._server_info
        keys = ("model_path", "dtype", "device", "attention_backend", "max_total_tokens",
                "max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "page_size",
                "schedule_policy", "disable_radix_cache", "disable_overlap_schedule", "tp_size",
                "dp_size", "kv_cache_dtype", "sampling_backend", "enable_torch_compile",
                "enable_mis", "multi_item_scoring_delimiter")
        return {
            **super().describe(),
            "version": info.get("version"),
            "url": self.url,
            "mode": "launch" if self.options.launches else "connect",
            "per_sample": self.options.per_sample,
            "radix_cache": _radix_cache(info, self.options.server_args),
            "multi_item_scoring": _multi_item(info, self.options.server_args),
            "server_settings": {k: info[k] for k in keys if k in info},
            "launch_command": info.get("launch_command"),
        }

    # -- requests -------------------------------------------------------------------------

    async def submit(self, request: Request) -> Result:
        if self._died:
            raise ServerDied(self._died)
        if isinstance(request, PrefillRequest):
            return await self._prefill(request)
        if isinstance(request, BeamRequest):
            return await self._beam(request)
        raise RequestRejected(f"sglang engine cannot serve a {type(request).__name__}")

    async def _prefill(self, request: PrefillRequest) -> PrefillResult:
        checked = self._checker.prefill(request)  # a query request keeps its query apart
        query, items, labels = checked.query, checked.items, checked.labels
        t0 = time.perf_counter()
        if self.options.per_sample:
            parts = await _gather_in_order([self._score(query, [item], labels) for item in items])
            scores = [row for part in parts for row in part]
        else:
            scores = await self._score(query, items, labels)
        return PrefillResult(id=request.id, scores=scores, stages={"http": (time.perf_counter() - t0) * 1e3})

    async def _score(self, query: list[int], items: list[list[int]], labels: list[int]) -> list[list[float]]:
        payload = await self._post("/v1/score", protocol.score_body(query, items, labels))
        return protocol.parse_scores(payload, len(items), len(labels))

    async def _beam(self, request: BeamRequest) -> BeamResult:
        if request.allowed is not None:
            raise RequestRejected("SGLang 0.5.23 cannot constrain beam search to allowed item codes "
                                  "(it refuses regex/json/ebnf/structural-tag constraints with beams)")
        checked = self._checker.beam(request)
        t0 = time.perf_counter()
        body = protocol.generate_body(checked.prompt, checked.beam_width, checked.decode_steps)
        beams = protocol.parse_beams(await self._post("/generate", body), checked.beam_width)
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

    async def _post(self, route: str, body: dict[str, Any]) -> Any:
        try:
            r = await self._http().post(route, json=body)
        except httpx.TimeoutException as e:
            await self._check_alive(e)
            raise EngineError(f"SGLang {route} timed out after {self.options.timeout_s:g} s "
                              f"(option timeout_s)") from e
        except httpx.HTTPError as e:
            await self._check_alive(e)
            raise EngineError(f"SGLang {route} failed: {type(e).__name__}: {e}") from e
        try:
            payload = r.json()
        except ValueError:
            payload = None
        if 400 <= r.status_code < 500:
            raise RequestRejected(f"SGLang {route} refused the request (HTTP {r.status_code}): "
                                  f"{protocol.error_message(payload, r.text)}")
        if r.status_code >= 500:
            await self._check_alive(None)
            raise EngineError(f"SGLang {route} failed (HTTP {r.status_code}): "
                              f"{protocol.error_message(payload, r.text)}")
        if payload is None:
            raise EngineError(f"SGLang {route} answered HTTP {r.status_code} with a body that is not JSON")
        return payload

    async def _check_alive(self, cause: Exception | None) -> None:
        """Raise ServerDied if the server is gone (process exited, or nothing answers /health)."""
        if self._server is not None:
            for _ in range(20):  # a crashing server drops connections just before it exits
                if not self._server.alive():
                    break
                await asyncio.sleep(0.05)
            else:
                return
            reason = (f"SGLang server (pid {self._server.pid}) exited with code {self._server.returncode}; "
                      f"last lines of {self._server.spec.log_path}:\n{log_tail(self._server.spec.log_path)}")
        else:
            if not isinstance(cause, (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)):
                return
            try:
                await self._http().get("/health", timeout=5)
                return
            except httpx.HTTPError as e:
                reason = f"SGLang server at {self.url} no longer answers ({type(e).__name__}: {e})"
        self._died = reason
        raise ServerDied(reason) from cause


def _radix_cache(info: dict[str, Any], args: Sequence[str]) -> str:
    """'on' / 'off' as the server reports it (else as the launch arguments ask)."""
    if "disable_radix_cache" in info:
        return "off" if info["disable_radix_cache"] else "on"
    return "off" if "--disable-radix-cache" in args else "on (not reported by the server)"


def _multi_item(info: dict[str, Any], args: Sequence[str]) -> str:
    """SGLang's multi-item scoring: --enable-mis (0.5.23), --multi-item-scoring-delimiter (older)."""
    if info.get("enable_mis") or "--enable-mis" in args:
        return "on (--enable-mis)"
    if info.get("multi_item_scoring_delimiter") is not None:
        return f"on (--multi-item-scoring-delimiter {info['multi_item_scoring_delimiter']})"
    return "off"


async def _gather_in_order(coros: list) -> list:
    """Run concurrently; results in input order; on the first failure cancel the rest."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
