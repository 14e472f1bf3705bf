"""The beam_search task: tokenize -> prefill -> step 1 .. step S -> format.

`tokenize` is request-scoped (it checks one business request against the bounds and
turns its allowed item codes into a trie, so a bad request fails alone, before batching);
the rest run once per merged batch and are the one beam walk: the runtime's prefill, a node
per decode step up to the declared `max_decode_steps` (a batch that asks for fewer steps
passes through the last ones), the outputs. `BeamUsage` is the batcher's rule for which
requests may share one execution.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from engines.base import BEAM_SEARCH, Beam, BeamRequest, BeamResult, Bounds, EngineConfig, RequestRejected
from engines.bounded.kernels.constraints import ItemCodeError, TrieCache
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.options import BoundedOptions
from engines.bounded.plan import BeamPlan, Plan
from engines.bounded.runtime.beam import BeamRuntime
from engines.bounded.runtime.beam_batch import BeamBatch, BeamJob
from engines.bounded.tasks.base import Task
from engines.bounded.tasks.batcher import Pending
from engines.bounded.tasks.dag import Dag, Node
from engines.tokens import eos_ids


class BeamUsage:
    """Up to the plan's requests, all with the same decode_steps (each request is at most the
    planned width, so the planned rows always suffice)."""

    def __init__(self, plan: BeamPlan):
        self.plan, self.steps, self.requests = plan, None, 0

    def fits(self, p: Pending) -> bool:
        return self.steps in (None, p.item.steps) and self.requests < self.plan.max_requests

    def add(self, p: Pending) -> None:
        self.steps, self.requests = p.item.steps, self.requests + 1


class BeamTask(Task):
    kind = BEAM_SEARCH
    runtime: BeamRuntime

    def __init__(self, runtime: BeamRuntime, bounds: Bounds, plan: BeamPlan):
        steps = [Node(f"step{j}", self._step(j), (f"step{j - 1}" if j > 1 else "prefill",))
                 for j in range(1, plan.max_steps + 1)]
        super().__init__(runtime, bounds, plan, Dag([
            Node("tokenize", self.tokenize, ("request",), scope="request"),
            Node("prefill", self.prefill, ("items",)),
            *steps,
            Node("format", self.format, (steps[-1].name,)),
        ], inputs={"request": ("request",), "batch": ("items",)}))
        self.tries: Optional[TrieCache] = None

    @classmethod
    def create(cls, config: EngineConfig, policy: PrecisionPolicy, plan: Plan, options: BoundedOptions,
               log: Callable[[str], None]) -> "BeamTask":
        runtime = BeamRuntime(config.model_dir, policy, config.device, plan.beam, eos_ids(config.model_dir),
                              options.compile, log, options.prefill_attention, options.cuda_graphs)
        return cls(runtime, config.bounds, plan.beam)

    def start(self, tokenizer: Any) -> None:
        super().start(tokenizer)
        self.tries = TrieCache(self.vocab, self.runtime.device)  # the beams' device: steps index it there

    def usage(self) -> BeamUsage:
        return BeamUsage(self.plan)

    def warm_up(self) -> None:
        p = self.plan  # the full planned batch, on a short prompt
        self.run([BeamJob([0] * min(p.max_prompt, 7), p.max_width, p.max_steps, id="warm-up")] * p.max_requests, {})

    # --- nodes ----------------------------------------------------------------------------

    def tokenize(self, req: BeamRequest) -> BeamJob:
        checked = self.checker.beam(req)  # codes exactly decode_steps long, W <= distinct codes
        trie = None
        if checked.allowed is not None:
            try:
                trie = self.tries.get(checked.allowed)
            except ItemCodeError as e:
                raise RequestRejected(f"request {req.id}: {e}") from e
        return BeamJob(checked.prompt, checked.beam_width, checked.decode_steps, trie, req.id)

    def prefill(self, jobs: list[BeamJob]) -> BeamBatch:
        return self.runtime.prefill(jobs)

    def _step(self, j: int):
        def step(batch: BeamBatch) -> BeamBatch:
            return self.runtime.step(batch, j)
        return step

    def format(self, batch: BeamBatch) -> list[BeamResult]:
        results = []
        for job, out in zip(batch.jobs, self.runtime.outputs(batch)):
            texts = self.tokenizer.batch_decode(out.tokens) if out.tokens else []
            results.append(BeamResult(job.id, [Beam(t, s, p) for t, s, p in zip(out.tokens, texts, out.scores)]))
        return results
