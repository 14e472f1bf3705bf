"""The bounded engine as the harness sees it: start (compile or load, allocate), submit
business requests, describe, stop.

`submit` runs the request-scope DAG nodes (tokenize + bounds) in a text thread, then hands
the request to the batcher, which merges concurrent requests into one call of the
batch-scope nodes (pack -> prefill -> score -> format, or prefill -> step 1..S -> format for
beam search) in the model thread. Each task kind the engine serves has its own DAG, runtime
and batcher; the model thread is shared.
"""
from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import torch

import engines.bounded as pkg
from engines.base import (BEAM_SEARCH, PREFILL_ONLY, BeamRequest, Engine, EngineConfig, EngineError,
                          EngineUnavailable, Request, RequestRejected, Result)
from engines.bounded.aot import ShapePolicy
from engines.bounded.batcher import Batcher, Budget, Pending
from engines.bounded.beam_graphs import BeamRuntime
from engines.bounded.beam_runtime import BeamPlan
from engines.bounded.beam_search import BeamBudget, BeamNodes, BeamUsage, build_beam_dag
from engines.bounded.config import GEMM_GROUPS, PrecisionPolicy
from engines.bounded.families import read_model_config
from engines.bounded.options import BoundedOptions, OptionError
from engines.bounded.runtime import PrefillRuntime
from engines.bounded.scoring import Limits, ScoringNodes, build_dag
from engines.tokens import eos_ids


def _log(msg: str) -> None:
    print(f"[bounded] {msg}", file=sys.stderr, flush=True)


class BoundedEngine(Engine):
    name = "bounded"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.options = BoundedOptions.parse(config.options)
        self.policy = PrecisionPolicy(config.dtype, self.options.residual,
                                      {g: "fp8" if g in self.options.fp8 else "dense" for g in GEMM_GROUPS})
        b = config.bounds
        self.budget = Budget(self.options.batch_tokens(b), self.options.batch_seqs(b), self.options.max_labels)
        self.shapes = ShapePolicy(max_tokens=self.budget.max_tokens, max_seqs=self.budget.max_seqs,
                                  max_len=min(b.max_prompt_tokens, self.budget.max_tokens),
                                  max_labels=self.options.max_labels)
        self.runtime = PrefillRuntime(config.model_dir, self.policy, config.device, self.shapes,
                                      self.options.compile, log=_log)
        self.serves = (PREFILL_ONLY, BEAM_SEARCH) if config.task_kind is None else (config.task_kind,)
        self.beam_plan = BeamPlan(self.options.beam_requests(b), b.max_beam_width, b.max_decode_steps,
                                  b.max_prompt_tokens)
        self.beam_runtime = BeamRuntime(config.model_dir, self.policy, config.device, self.beam_plan,
                                        eos_ids(config.model_dir), self.options.compile, log=_log)
        self.stats = {"requests": 0, "batches": 0, "largest_batch": 0}
        self._batcher: Optional[Batcher] = None
        self._beam_batcher: Optional[Batcher] = None
        self._started = False

    @classmethod
    def check_available(cls, config: EngineConfig) -> None:
        if config.task_kind not in (None, PREFILL_ONLY, BEAM_SEARCH):
            raise EngineUnavailable(f"bounded: task {config.task_kind!r} is not supported "
                                    f"(tasks: {PREFILL_ONLY}, {BEAM_SEARCH})")
        try:
            opts = BoundedOptions.parse(config.options)
        except OptionError as e:
            raise EngineUnavailable(f"bounded: {e}") from e
        dev = torch.device(config.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise EngineUnavailable("bounded: device cuda requested but torch sees no GPU")
        if opts.fp8 and not (dev.type == "cuda" and torch.cuda.get_device_capability(dev) >= (8, 9)):
            raise EngineUnavailable("bounded: fp8 GEMMs need a CUDA GPU with compute capability >= 8.9")

    # --- lifecycle ----------------------------------------------------------------------

    def compile(self) -> dict[str, Any]:
        """Compile (or find in the cache) the AOT package for this config, without serving.
        What a `bench compile` command calls."""
        read_model_config(self.config.model_dir)  # fail early on an unknown family
        status = self.runtime.compile() if PREFILL_ONLY in self.serves else {}
        if BEAM_SEARCH in self.serves:
            self.beam_runtime.compile()
            status["beam"] = dict(self.beam_runtime.status)
        return status

    def start(self) -> None:
        from transformers import AutoTokenizer

        t0 = time.perf_counter()
        cfg = read_model_config(self.config.model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.config.model_dir))
        if PREFILL_ONLY in self.serves:
            self.runtime.start()
        limits = Limits(cfg.vocab, self.options.max_labels, self.budget.max_tokens)
        self.dag = build_dag(ScoringNodes(self.tokenizer, self.runtime, self.config.bounds, limits))
        if BEAM_SEARCH in self.serves:
            self.beam_runtime.start()
        self.beam_dag = build_beam_dag(BeamNodes(self.tokenizer, self.beam_runtime, self.config.bounds, cfg.vocab),
                                       self.beam_plan.max_steps)
        self._model_pool = ThreadPoolExecutor(1, thread_name_prefix="bounded-model")
        self._text_pool = ThreadPoolExecutor(1, thread_name_prefix="bounded-text")
        self._started = True
        self.start_s = time.perf_counter() - t0

    def stop(self) -> None:
        for batcher in (self._batcher, self._beam_batcher):
            if batcher is not None:
                batcher.close()
        self._batcher = self._beam_batcher = None
        if self._started:
            self._model_pool.shutdown(wait=True)
            self._text_pool.shutdown(wait=True)
            self._started = False

    def describe(self) -> dict[str, Any]:
        b = self.config.bounds
        return {
            "name": self.name,
            "version": pkg.__version__,
            "torch": torch.__version__,
            "device": self.config.device,
            "dtype": self.config.dtype,
            "precision": self.policy.describe(),
            **{k: v for k, v in self.runtime.status.items() if k != "compile_requested"},
            "compile_requested": self.options.compile,
            "bounds": {"max_samples_per_request": b.max_samples_per_request,
                       "max_prompt_tokens": b.max_prompt_tokens, "on_violation": b.on_violation},
            "batching": {"max_wait_ms": self.options.max_wait_ms,
                         "max_batch_tokens": self.budget.max_tokens,
                         "max_batch_seqs": self.budget.max_seqs, "max_labels": self.budget.max_labels},
            "dag": {"request": self.dag.names("request"), "batch": self.dag.names("batch")}
            if self._started else None,
            "serves": list(self.serves),
            "beam": {"status": dict(self.beam_runtime.status), "max_beam_width": b.max_beam_width,
                     "max_decode_steps": b.max_decode_steps, "batch_requests": self.beam_plan.max_requests,
                     "dag": self.beam_dag.names("batch") if self._started else None}
            if BEAM_SEARCH in self.serves else None,
            "stats": dict(self.stats),
            "options": dict(self.config.options),
        }

    # --- serving ------------------------------------------------------------------------

    async def submit(self, request: Request) -> Result:
        kind = BEAM_SEARCH if isinstance(request, BeamRequest) else request.kind
        if kind not in self.serves:
            raise RequestRejected(f"this engine was started for {', '.join(self.serves)}, not {kind}")
        if not self._started:
            raise EngineError("bounded engine not started")
        loop = asyncio.get_running_loop()
        stages: dict[str, float] = {}
        state = await loop.run_in_executor(self._text_pool, self._request_scope, request, stages)
        if kind == BEAM_SEARCH:
            return await self._beam_batcher_here().submit(state, stages)
        return await self._batcher_here().submit(state, stages)

    def _request_scope(self, request: Request, stages: dict[str, float]) -> dict[str, Any]:
        dag = self.beam_dag if isinstance(request, BeamRequest) else self.dag
        try:
            return dag.run("request", {"request": request}, stages)
        except EngineError:
            raise
        except Exception as e:  # malformed input the tokenizer chokes on
            raise RequestRejected(f"request {request.id}: {type(e).__name__}: {e}") from e

    def _batcher_here(self) -> Batcher:
        loop = asyncio.get_running_loop()
        if self._batcher is None or self._batcher.loop is not loop:
            self._batcher = Batcher(self._execute, self._model_pool, self.budget,
                                    self.options.max_wait_ms / 1000.0)
        return self._batcher

    def _beam_batcher_here(self) -> Batcher:
        loop = asyncio.get_running_loop()
        if self._beam_batcher is None or self._beam_batcher.loop is not loop:
            self._beam_batcher = Batcher(self._execute, self._model_pool, BeamBudget(self.beam_plan.max_requests),
                                         self.options.max_wait_ms / 1000.0, usage=BeamUsage)
        return self._beam_batcher

    def _execute(self, batch: list[Pending]) -> list[Any]:
        """Model thread: one merged call; if it fails, each request alone, so only the
        culprit fails."""
        try:
            return self._run_batch(batch)
        except Exception as e:
            if len(batch) == 1:
                return [e if isinstance(e, EngineError) else EngineError(f"{type(e).__name__}: {e}")]
            return [self._execute([p])[0] for p in batch]

    def _run_batch(self, batch: list[Pending]) -> list[Any]:
        t0 = time.perf_counter()
        stages: dict[str, float] = {}
        dag = self.beam_dag if "job" in batch[0].state else self.dag
        state = dag.run("batch", {"items": [p.state for p in batch]}, stages)
        self.stats["requests"] += len(batch)
        self.stats["batches"] += 1
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))
        for p, result in zip(batch, state["results"]):
            result.stages = {**p.stages, "queue": (t0 - p.enqueued) * 1000.0, **stages}
        return state["results"]
