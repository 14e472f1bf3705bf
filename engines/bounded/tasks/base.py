"""What the task kinds share: a task is a runtime, a static DAG over typed stage data and a
batching rule. The engine holds one task per kind it serves and knows nothing else of them.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Optional

import torch

from engines.base import Bounds, EngineConfig, EngineError, Request, RequestRejected, Result
from engines.bounded.model.families import read_model_config
from engines.bounded.model.precision import LAYER_GROUPS, PrecisionPolicy
from engines.bounded.options import BoundedOptions
from engines.bounded.plan import Plan
from engines.bounded.runtime.compiled import CompiledRuntime
from engines.bounded.tasks.batcher import Usage
from engines.bounded.tasks.dag import Clock, Dag, EventClock, HostClock
from engines.validate import Limits, RequestChecker


class Task:
    kind: str
    gemm_groups: tuple[str, ...] = LAYER_GROUPS  # the precision groups whose GEMMs this task runs
    """Subclasses build `self.dag`: request-scope input "request", one request-scope node
    "tokenize" (its output is what the batcher holds), batch-scope input "items" (those
    outputs, in order), and a last node "format" -> one Result per item."""

    def __init__(self, runtime: CompiledRuntime, bounds: Bounds, plan: Any, dag: Dag):
        self.runtime, self.bounds, self.plan, self.dag = runtime, bounds, plan, dag
        self.tokenizer: Optional[Any] = None
        self.checker: Optional[RequestChecker] = None
        self.vocab = 0

    @classmethod
    def create(cls, config: EngineConfig, policy: PrecisionPolicy, plan: Plan, options: BoundedOptions,
               log: Callable[[str], None]) -> "Task":
        """The task with its runtime, for an engine's config (nothing is loaded yet)."""
        raise NotImplementedError

    def compile(self) -> dict[str, Any]:
        return self.runtime.compile()

    def start(self, tokenizer: Any, warm_up: bool = True) -> None:
        self.tokenizer, self.vocab = tokenizer, read_model_config(self.runtime.model_dir).vocab
        # the engines' shared request check (types, ids, labels, item codes, bounds)
        self.checker = RequestChecker(Limits.for_model(self.runtime.model_dir, self.bounds), tokenizer)
        self.runtime.start()
        if warm_up:
            self.runtime.warm_up(self.warm_up)

    def warm_up(self) -> None:
        """One small batch through the batch scope (first-call initialisation)."""
        raise NotImplementedError

    def usage(self) -> Usage:
        """The empty tally of a new batch (the batcher's rule for this kind)."""
        raise NotImplementedError

    def prepare(self, request: Request, stages: dict[str, float]) -> Any:
        """The request scope: check and tokenize one request; a bad one fails alone, here."""
        try:
            return self.dag.run("request", {"request": request}, stages)["tokenize"]
        except EngineError:
            raise
        except Exception as e:  # malformed input the tokenizer chokes on
            raise RequestRejected(f"request {request.id}: {type(e).__name__}: {e}") from e

    def run(self, items: list[Any], stages: dict[str, float]) -> list[Result]:
        """The batch scope: one merged execution of the prepared requests (stage times on the
        device's clock)."""
        return self.dag.run("batch", {"items": items}, stages, self.clock())["format"]

    def clock(self) -> Clock:
        if self.runtime.device.type == "cuda":
            return EventClock(lambda: torch.cuda.Event(enable_timing=True))
        return HostClock()

    def describe(self) -> dict[str, Any]:
        return {"status": dict(self.runtime.status), "plan": asdict(self.plan),
                "dag": {"request": self.dag.names("request"), "batch": self.dag.names("batch")}}
