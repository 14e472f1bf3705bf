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

import torch

from engines.base import BEAM_SEARCH, Beam, BeamRequest, BeamResult, Bounds, EngineConfig, RequestRejected
from engines.bounded.kernels.constraints import ItemCodeError, TrieCache
from engines.bounded.model.precision import GEMM_GROUPS, PrecisionPolicy
from engines.bounded.options import BoundedOptions
from engines.bounded.plan import BeamPlan, Plan
from engines.bounded.runtime.beam import BeamRuntime
from engines.bounded.runtime.beam_batch import BeamBatch, BeamJob
from engines.bounded.tasks.base import Task
from engines.bounded.tasks.batcher import Pending
from engines.bounded.tasks.dag import Dag, Node
from engines.bounded.tasks.gate import Distance
from engines.encode import batch_decoder
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

    def full(self) -> bool:
        return self.requests >= self.plan.max_requests


class BeamTask(Task):
    kind = BEAM_SEARCH
    gemm_groups = GEMM_GROUPS  # the layers' and the full-vocabulary head's
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
                              options.compile, log, options.prefill_attention, options.cuda_graphs,
                              kernel_profile=options.kernel_profile)
        return cls(runtime, config.bounds, plan.beam)

    def start(self, tokenizer: Any, warm_up: bool = True) -> None:
        self._decode = batch_decoder(tokenizer)  # the warm-up formats too
        super().start(tokenizer, warm_up)
        self.tries = TrieCache(self.vocab, self.runtime.device)  # the beams' device: steps index it there

    def usage(self) -> BeamUsage:
        return BeamUsage(self.plan)

    def warm_up(self) -> None:
        # the full planned batch, then one request (concurrency 1's shape), on a short prompt:
        # oneDNN makes a GEMM's kernel on the first call at each row count, and without the
        # second pass the first lone request paid for it (1.4 s vs ~1.0 s on beam_short here)
        p = self.plan
        job = BeamJob([0] * min(p.max_prompt, 7), p.max_width, p.max_steps, id="warm-up")
        for requests in sorted({p.max_requests, 1}, reverse=True):
            self.run([job] * requests, {})

    # --- accuracy gate (tasks/gate.py) ------------------------------------------------------

    def calibration_items(self, seed: int = 0) -> list[BeamJob]:
        """2 seeded random-token prompts (up to 32 tokens) at the planned width and steps."""
        g, p = torch.Generator().manual_seed(seed), self.plan
        length = max(1, min(p.max_prompt, 32))
        return [BeamJob(torch.randint(0, self.vocab, (length - r,), generator=g).tolist(), p.max_width,
                        p.max_steps, id=f"calibration-{r}") for r in range(2)]

    @staticmethod
    def distance(reference: list[BeamResult], got: list[BeamResult]) -> Distance:
        overlaps, diffs = [], []
        for a, b in zip(reference, got):
            la = {tuple(x.token_ids): x.logprob for x in a.beams}
            lb = {tuple(x.token_ids): x.logprob for x in b.beams}
            shared = la.keys() & lb.keys()
            overlaps.append(len(shared) / max(len(la), len(lb), 1))
            diffs += [abs(la[k] - lb[k]) for k in shared]
        mean = sum(diffs) / len(diffs) if diffs else float("inf")
        return Distance(mean, max(diffs, default=float("inf")), sum(overlaps) / len(overlaps), error_judged=False)

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
            texts = self._decode(out.tokens) if out.tokens else []
            results.append(BeamResult(job.id, [Beam(t, s, p) for t, s, p in zip(out.tokens, texts, out.scores)]))
        return results
