"""The `sglang` engine: an async HTTP client of a real SGLang server, which it either
connects to (`url`) or launches from SGLang's own environment (see `env.py`). What is
shared with the other server engines (launch, HTTP, failures) is in engines/server/; what
SGLang does with our requests is in `protocol.py`.

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

from dataclasses import replace
from typing import Any, Sequence

import httpx

from engines.base import Beam, Description, EngineUnavailable
from engines.server import ServerDied, ServerEngine, ServerOptions
from engines.sglang import protocol
from engines.sglang.env import SGLANG_VERSION, VENV, cpu_server_env

# What SGLang 0.5.23 needs on a CPU: the CPU engine, eager torch attention, and a KV pool
# cap (without it the pool takes ~11 GB of RAM).
CPU_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--max-total-tokens", "16384")

SGLangOptions = ServerOptions

__all__ = ["CPU_ARGS", "SGLangEngine", "SGLangOptions", "ServerDied"]


class SGLangEngine(ServerEngine):
    name = "sglang"
    label = "SGLang"
    venv = VENV
    setup_command = "bench sglang setup"
    constraint_refusal = (f"SGLang {SGLANG_VERSION} cannot constrain beam search to allowed item codes "
                          "(it refuses regex/json/ebnf/structural-tag constraints with beams)")

    def launch_command(self, port: int) -> list[str]:
        cmd = [str(self.python_path(self.options)), "-m", "sglang.launch_server",
               "--model-path", str(self.config.model_dir), "--host", self.options.host, "--port", str(port),
               "--dtype", self.config.dtype]
        if self.config.device == "cpu":
            cmd += CPU_ARGS
        elif self.config.device.startswith("cuda:"):
            cmd += ["--base-gpu-id", self.config.device.split(":", 1)[1]]
        return cmd + list(self.options.server_args)  # extra args last: argparse lets them override ours

    def launch_env(self) -> dict[str, str]:
        env = super().launch_env()
        return cpu_server_env(self.python_path(self.options), env) if self.config.device == "cpu" else env

    def fetch_server_info(self, client: httpx.Client) -> dict[str, Any]:
        for route in ("/server_info", "/get_server_info"):  # 0.5.23 has both; older only the second
            r = client.get(route)
            if r.status_code == 200:
                return r.json()
        raise EngineUnavailable(f"SGLang server at {self.url} has no server-info route (HTTP {r.status_code})")

    def describe(self) -> Description:
        info = self._server_info
        keys = ("model_path", "dtype", "device", "attention_backend", "max_total_tokens",
                "max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "page_size",
                "schedule_policy", "disable_radix_cache", "disable_overlap_schedule", "tp_size",
                "dp_size", "kv_cache_dtype", "sampling_backend", "enable_torch_compile",
                "enable_mis", "multi_item_scoring_delimiter")
        return replace(super().describe(), version=info.get("version")).with_details(
            radix_cache=_radix_cache(info, self.options.server_args),
            multi_item_scoring=_multi_item(info, self.options.server_args),
            server_settings={k: info[k] for k in keys if k in info},
            launch_command=info.get("launch_command"),
            # what `bench serve` says of itself: the engine behind it and (with --ray) the
            # replica count and placement; a real SGLang has neither
            **({"served_engine": info["engine"]} if isinstance(info.get("engine"), dict) else {}),
            **({"deployment": info["deployment"]} if isinstance(info.get("deployment"), dict) else {}))

    async def score(self, query: list[int], items: list[list[int]], labels: list[int]) -> list[list[float]]:
        payload = await self.post("/v1/score", protocol.score_body(query, items, labels))
        return protocol.parse_scores(payload, len(items), len(labels))

    async def beam_search(self, prompt: list[int], beam_width: int, decode_steps: int) -> list[Beam]:
        body = protocol.generate_body(prompt, beam_width, decode_steps)
        return protocol.parse_beams(await self.post("/generate", body), beam_width)


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
