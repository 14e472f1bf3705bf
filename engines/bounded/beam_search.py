"""The beam_search task as DAG nodes: tokenize -> prefill -> step 1 .. step S -> format.

`tokenize` is request-scoped (it checks one business request against the bounds and
turns its allowed item codes into a trie, so a bad request fails alone, before batching);
the rest run once per merged batch. The DAG has a node per decode step up to the declared
`max_decode_steps`; a batch that asks for fewer steps passes through the last ones.
`BeamUsage` is the batcher's rule for which requests may share one execution.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engines.base import BeamRequest, BeamResult, Beam, Bounds, RequestRejected
from engines.bounded.beam_graphs import BeamRuntime
from engines.bounded.beam_runtime import BeamJob
from engines.bounded.constraints import ItemCodeError, TrieCache
from engines.bounded.dag import Dag, Node
from engines.tokens import apply_bounds, check_beam, encode


@dataclass(frozen=True)
class BeamBudget:
    max_requests: int  # requests whose beams share one decode step (BeamPlan.max_requests)


class BeamUsage:
    """Batcher rule: up to the budget's requests, all with the same decode_steps (each
    request is at most the planned width, so the planned rows always suffice)."""

    def __init__(self) -> None:
        self.steps, self.requests = None, 0

    def fits(self, p: Any, b: BeamBudget) -> bool:
        steps = p.state["job"].steps
        return self.steps in (None, steps) and self.requests < b.max_requests

    def add(self, p: Any) -> None:
        self.steps, self.requests = p.state["job"].steps, self.requests + 1


class BeamNodes:
    def __init__(self, tokenizer: Any, runtime: BeamRuntime, bounds: Bounds, vocab: int):
        self.tokenizer, self.runtime, self.bounds, self.vocab = tokenizer, runtime, bounds, vocab
        self.tries = TrieCache(vocab, runtime.device)  # the beams' device: steps index it there

    def tokenize(self, st: dict[str, Any]) -> dict[str, Any]:
        req: BeamRequest = st["request"]
        check_beam(self.bounds, req.beam_width, req.decode_steps)
        prompt = apply_bounds(self.bounds, [encode(self.tokenizer, req.prompt)], "prompt")[0]
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise RequestRejected(f"token ids outside the vocabulary [0, {self.vocab}): {bad[:5]}")
        trie = None
        if req.allowed is not None:
            try:
                trie = self.tries.get(req.allowed)
            except ItemCodeError as e:
                raise RequestRejected(f"request {req.id}: {e}") from e
        return {"job": BeamJob(prompt, req.beam_width, req.decode_steps, trie)}

    def prefill(self, st: dict[str, Any]) -> dict[str, Any]:
        return {"beams0": self.runtime.runner.prefill([it["job"] for it in st["items"]])}

    def step(self, j: int):
        def run(st: dict[str, Any]) -> dict[str, Any]:
            batch = st[f"beams{j - 1}"]
            self.runtime.runner.step(batch, j)
            return {f"beams{j}": batch}
        return run

    def format(self, st: dict[str, Any], last: str) -> dict[str, Any]:
        outputs = self.runtime.runner.outputs(st[last])
        results = []
        for it, out in zip(st["items"], outputs):
            texts = self.tokenizer.batch_decode(out.tokens) if out.tokens else []
            beams = [Beam(t, s, p) for t, s, p in zip(out.tokens, texts, out.scores)]
            results.append(BeamResult(it["request"].id, beams))
        return {"results": results}


def build_beam_dag(nodes: BeamNodes, max_steps: int) -> Dag:
    steps = [Node(f"step{j}", nodes.step(j), (f"beams{j - 1}",), (f"beams{j}",)) for j in range(1, max_steps + 1)]
    last = f"beams{max_steps}"
    return Dag(
        [
            Node("tokenize", nodes.tokenize, ("request",), ("job",), scope="request"),
            Node("prefill", nodes.prefill, ("items",), ("beams0",)),
            *steps,
            Node("format", lambda st: nodes.format(st, last), ("items", last), ("results",)),
        ],
        inputs={"request": ("request",), "batch": ("items",)},
    )
