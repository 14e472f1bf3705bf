"""The bounded engine as the harness sees it: start (compile or load, allocate), submit
business requests, describe, stop.

The engine holds one Task per task kind it serves (tasks/prefill.py, tasks/beam.py).
`submit` hands the request to its task's batcher (tasks/batcher.py) in one hop: the task's
model thread runs the request-scope nodes (check + tokenize), merges what is waiting into one
run of the batch-scope nodes (work-conserving: an idle model starts at once), and answers.
Each task starts (loads, warms up, is judged) on its model thread, so the caller's thread
opens no OpenMP team (tasks/batcher.py says why). The tasks' threads share one lock: one model
call at a time.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
from typing import Any

import torch

import engines.bounded as pkg
from engines.base import (Description, Engine, EngineConfig, EngineError, EngineUnavailable, Precision, Request,
                          RequestRejected, Result)
from engines.bounded.model.families import read_model_config
from engines.bounded.model.precision import PrecisionPolicy, choose_dtype
from engines.bounded.options import BoundedOptions, OptionError
from engines.bounded.plan import plan
from engines.bounded.runtime import hugepages, memory
from engines.bounded.tasks.base import Task
from engines.bounded.tasks.batcher import Batcher, Pending
from engines.bounded.tasks import gate
from engines.bounded.tasks.beam import BeamTask
from engines.bounded.tasks.prefill import PrefillTask
from engines.hardware import cpu_gemm_gflops, probe

# the task kinds this engine serves, by name (a new kind is a Task subclass and a line here)
TASKS: dict[str, type[Task]] = {PrefillTask.kind: PrefillTask, BeamTask.kind: BeamTask}


def _log(msg: str) -> None:
    print(f"[bounded] {msg}", file=sys.stderr, flush=True)


def policy_for(config: EngineConfig, options: BoundedOptions) -> PrecisionPolicy:
    """The precision policy for the scenario's dtype, the options and this device."""
    caps = probe(config.device)
    dtype, why = choose_dtype(config.dtype, options.precision, caps,
                              cpu_gemm_gflops if caps.device_type == "cpu" else None)
    return PrecisionPolicy(dtype, options.residual, options.gemm_kinds(), requested=config.dtype, why=why)


class BoundedEngine(Engine):
    name = "bounded"
    takes_query_requests = True  # tasks/prefill.py: the query prefilled once, its items sharing it

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.options = BoundedOptions.parse(config.options)
        self.policy = policy_for(config, self.options)
        self.plan = plan(config.bounds, self.options)
        kinds = list(TASKS) if config.task_kind is None else [config.task_kind]
        self.tasks: dict[str, Task] = {k: TASKS[k].create(config, self.policy, self.plan, self.options, _log)
                                       for k in kinds}
        self.stats = {"requests": 0, "batches": 0, "largest_batch": 0}
        self.gates: dict[str, dict[str, Any]] = {}  # task kind -> the accuracy gate's verdict
        self._batchers: dict[str, Batcher] = {}
        self._started = False
        self._memory = memory.Held(False)
        self.huge_pages = hugepages.Backing(note="not started")

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        BoundedOptions.parse(options)  # OptionError (a ValueError) names the option and the known ones

    @classmethod
    def check_available(cls, config: EngineConfig) -> None:
        if config.task_kind is not None and config.task_kind not in TASKS:
            raise EngineUnavailable(f"bounded: task {config.task_kind!r} is not supported "
                                    f"(tasks: {', '.join(TASKS)})")
        try:
            opts = BoundedOptions.parse(config.options)
        except OptionError as e:
            raise EngineUnavailable(f"bounded: {e}") from e
        dev = torch.device(config.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise EngineUnavailable("bounded: device cuda requested but torch sees no GPU")
        why = policy_for(config, opts).unsupported(dev.type, probe(config.device))
        if why:
            raise EngineUnavailable(f"bounded: {why}")
        if opts.fp8 and policy_for(config, opts).dtype != "bfloat16":
            raise EngineUnavailable(f"bounded: fp8 GEMMs with rowwise scales give bfloat16 results; dtype is "
                                    f"{config.dtype} (use bfloat16)")

    # --- lifecycle ----------------------------------------------------------------------

    def compile(self) -> dict[str, Any]:
        """Compile (or find in the cache) the AOT packages of every served task, and judge a
        low-precision plan with the accuracy gate, without serving: what `bench compile`
        calls. -> {task kind: its runtime's status (and the gate's verdict)}."""
        read_model_config(self.config.model_dir)  # fail early on an unknown family
        status = {kind: task.compile() for kind, task in self.tasks.items()}
        if any(self._judged(task) for task in self.tasks.values()):
            tokenizer = self._tokenizer()
            for kind, task in self.tasks.items():
                if self._judged(task):
                    task.start(tokenizer, warm_up=False)
                    status[kind]["accuracy_gate"] = self._gate(task, tokenizer)
        return status

    def start(self) -> None:
        t0 = time.perf_counter()
        read_model_config(self.config.model_dir)
        if torch.device(self.config.device).type == "cpu":  # no buffer mapped afresh per call (runtime/memory.py)
            self._memory.release()
            self._memory = memory.keep_freed_memory()
        tokenizer = self._tokenizer()
        lock = threading.Lock()
        # each task starts (loads, allocates, warms up, is judged) on the thread that will run
        # its calls: the caller's thread opens no OpenMP team of its own (tasks/batcher.py)
        self._batchers = {kind: Batcher(functools.partial(self._execute, task), task.usage,
                                        self.options.max_wait_ms / 1000.0, task.prepare, lock, f"bounded-{kind}",
                                        setup=functools.partial(self._start_task, task, tokenizer))
                          for kind, task in self.tasks.items()}
        try:
            for batcher in self._batchers.values():
                batcher.ready()
        except BaseException:  # a task failed to start (or Ctrl-C): the others stop after their start
            for batcher in self._batchers.values():
                batcher.close()
            self._batchers = {}
            self._memory.release()
            raise
        if torch.device(self.config.device).type == "cpu":  # loaded and warm: onto 2 MB pages (runtime/hugepages.py)
            self.huge_pages = hugepages.back_with_huge_pages()
            _log(self.huge_pages.line())
        self._started = True
        self.start_s = time.perf_counter() - t0

    def _start_task(self, task: Task, tokenizer: Any) -> None:
        task.start(tokenizer)
        if self._judged(task):
            self.gates[task.kind] = self._gate(task, tokenizer)

    def _tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.config.model_dir))

    def _judged(self, task: Task) -> bool:
        """Does the accuracy gate judge this task's plan (a low-precision group it runs)?"""
        return bool(self.policy.low_precision_groups(task.gemm_groups))

    def _gate(self, task: Task, tokenizer: Any) -> dict[str, Any]:
        def reference(policy: PrecisionPolicy) -> Task:  # the same task, eager, in a float policy
            eager = dataclasses.replace(self.options, compile="eager", cuda_graphs=False)
            ref = TASKS[task.kind].create(self.config, policy, self.plan, eager, lambda m: None)
            ref.start(tokenizer, warm_up=False)
            return ref

        return gate.check(task, reference, self.policy, self.options.gate, _log)

    def stop(self) -> None:
        for batcher in self._batchers.values():
            batcher.close()
        for batcher in self._batchers.values():
            batcher.join()  # the running call ends
        self._batchers = {}
        self._started = False
        self._memory.release()

    def describe(self) -> Description:
        b, p = self.config.bounds, self.plan
        mode, fallback, graphs = self._mode()
        failed = any(not v.get("passed") for v in self.gates.values())
        precision = Precision(self.policy.dtype, self.policy.summary(), self.policy.why,
                              bool(self.policy.low_precision_groups()), failed)
        summary = {"prefill_only": f"prefill {p.prefill.max_tokens} tokens / {p.prefill.max_seqs} sequences per call",
                   "beam_search": f"beams {p.beam.max_requests} x {p.beam.max_width} wide, {p.beam.max_steps} steps"}
        return Description(self.name, self.config.device, self.config.dtype, precision, pkg.__version__, mode,
                           fallback, graphs, "; ".join(summary[k] for k in self.tasks if k in summary), {
            "torch": torch.__version__,
            "precision_policy": {**self.policy.describe(), "accuracy_gate": dict(self.gates) or "not needed: no "
                                 "low-precision GEMM group"},
            "compile_requested": self.options.compile,
            "bounds": {"max_samples_per_request": b.max_samples_per_request,
                       "max_prompt_tokens": b.max_prompt_tokens, "max_beam_width": b.max_beam_width,
                       "max_decode_steps": b.max_decode_steps, "max_query_tokens": b.max_query_tokens,
                       "max_item_tokens": b.max_item_tokens, "on_violation": b.on_violation},
            "batching": {"max_wait_ms": self.options.max_wait_ms},
            "memory": self.huge_pages.line(),
            "serves": list(self.tasks),
            **{kind: task.describe() for kind, task in self.tasks.items()},
            "stats": dict(self.stats),
            "options": dict(self.config.options),
        })

    def _mode(self) -> tuple[str, str | None, str]:
        """How the engine serves, in one line for the summary table (mode), why it serves
        otherwise than asked (fallback), and its CUDA graphs (captured, failed or not used),
        from its tasks' runtime status."""
        statuses = {kind: task.runtime.status for kind, task in self.tasks.items()}
        used = sorted({s.get("compile", self.options.compile) for s in statuses.values()})
        reasons = [f"{kind}: {s['fallback_reason']}" for kind, s in statuses.items() if s.get("fallback_reason")]
        graphs = [s["cuda_graphs"] for s in statuses.values() if isinstance(s.get("cuda_graphs"), dict)]
        reasons += [f"CUDA graphs: {g['fallback_reason']}" for g in graphs if g.get("fallback_reason")]
        mode = "+".join(used)
        if self.options.compile == "aot" and "eager" in used:
            mode += " (AOT failed)"
        captured = "captured" if any(g.get("captured") for g in graphs) else "failed" if graphs else "not used"
        mode += {"captured": " + CUDA graphs", "failed": " (CUDA graphs failed)", "not used": ""}[captured]
        return mode, "; ".join(reasons) or None, captured

    # --- serving ------------------------------------------------------------------------

    async def submit(self, request: Request) -> Result:
        task = self.tasks.get(request.kind)
        if task is None:
            raise RequestRejected(f"this engine was started for {', '.join(self.tasks)}, not {request.kind}")
        if not self._started:
            raise EngineError("bounded engine not started")
        return await self._batchers[task.kind].submit(request, {})

    def _execute(self, task: Task, batch: list[Pending]) -> list[Any]:
        """Model thread: one merged run; if it fails, each request alone, so only the culprit
        fails."""
        try:
            return self._run_batch(task, batch)
        except Exception as e:
            if len(batch) == 1:
                return [e if isinstance(e, EngineError) else EngineError(f"{type(e).__name__}: {e}")]
            return [self._execute(task, [p])[0] for p in batch]

    def _run_batch(self, task: Task, batch: list[Pending]) -> list[Any]:
        stages: dict[str, float] = {}
        results = task.run([p.item for p in batch], stages)
        self.stats["requests"] += len(batch)
        self.stats["batches"] += 1
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))
        for p, result in zip(batch, results):
            result.stages = {**p.stages, **stages}
        return results
