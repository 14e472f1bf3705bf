"""The beam_search runtime: the beam graphs (AOT-compiled or eager), the planned buffers,
and the three moves of a fixed-step walk over a batch of requests -- `prefill`, `step(j)`,
`outputs` -- which the beam task's DAG nodes call in order (tasks/beam.py).

Two programs: the beam prefill (dynamic packed tokens, prompts, prompt length) and one
decode-step graph per width bucket W (fixed W rows per request; dynamic number of requests
R, so B = W * R rows, and dynamic prompt length P). A request of width w runs in the
smallest compiled bucket W >= w (the padding rows are wasted work); eagerly, a batch runs
at its own widest request. Once compiled, the eager model's weights are freed but for the
head, which runs outside the graphs. The prompt K/V of each request is written once, after
the prefill; each beam keeps only its suffix K/V, in two ping-pong buffers: reordering
beams after a step gathers the suffix rows into the other buffer, and nothing else moves.

Row layout of a batch: request r owns rows [r*W, (r+1)*W) of the W-row width bucket; rows
past its own width, and beams that died (no allowed continuation), carry score -inf and are
never chosen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from engines.bounded.kernels import head, select
from engines.bounded.kernels.constraints import ROOT, ItemTrie
from engines.bounded.model.families import read_model_config
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.plan import BeamPlan
from engines.bounded.programs.beam import BeamDecodeStep, BeamPrefill
from engines.bounded.runtime import export
from engines.bounded.runtime.buffers import BeamBuffers
from engines.bounded.runtime.compiled import CompiledRuntime, Graph

@dataclass(frozen=True)
class BeamJob:
    """One request as the runtime sees it."""

    prompt: Sequence[int]
    width: int
    steps: int
    trie: Optional[ItemTrie] = None
    id: str = ""


@dataclass
class BeamOutput:
    tokens: list[list[int]]  # generated tokens of each beam, best first
    scores: list[float]  # cumulative log-probabilities, same order


@dataclass
class BeamState:
    """The beams of a batch between steps: [R, W] each."""

    scores: Tensor  # float32 cumulative log-probability, -inf for dead/padding rows
    history: Tensor  # [R, W, S] int64 generated tokens so far
    nodes: Tensor  # trie node per beam (constrained requests)
    parents: Tensor  # row within the request of each beam's parent at the last step


@dataclass
class BeamBatch:
    """One batch between the walk's moves: its jobs, the shapes chosen for it, its beams."""

    jobs: Sequence[BeamJob]
    steps: int
    width: int  # rows per request (the width bucket)
    step_graph: Graph
    prompt_len: Tensor  # [R]
    longest: int
    hidden: Optional[Tensor] = None  # [R, hidden] after the prefill, for step 1
    state: Optional[BeamState] = None

    @property
    def requests(self) -> int:
        return len(self.jobs)


class BeamRuntime(CompiledRuntime):
    def __init__(self, model_dir: Path, policy: PrecisionPolicy, device: str, plan: BeamPlan,
                 banned: Sequence[int], compile_mode: str = "aot", log: Callable[[str], None] = print):
        super().__init__(model_dir, policy, device, compile_mode, log)
        self.plan, self.banned_ids = plan, list(banned)
        self.buffers: Optional[BeamBuffers] = None

    # --- build ----------------------------------------------------------------------------

    def max_positions(self) -> int:
        return self.plan.max_positions

    def exports(self) -> list[export.Export]:
        p, d = self.plan, self.device
        cfg = read_model_config(self.model_dir)
        steps = [export.beam_step(p, w, cfg, lambda: BeamDecodeStep(self.model()).eval(), d)
                 for w in sorted(set(p.widths))]
        return [export.beam_prefill(p, lambda: BeamPrefill(self.model()).eval(), d), *steps]

    def eager_graphs(self) -> dict[str, Graph]:
        return {"beam_prefill": BeamPrefill(self.model()).eval(), "beam_step": BeamDecodeStep(self.model()).eval()}

    def serve(self, graphs: dict[str, Graph], compiled: bool) -> None:
        self._prefill = graphs["beam_prefill"]
        # width bucket -> step graph; eagerly one graph that runs at any width
        self._steps = {w: graphs[f"beam_step_w{w}"] for w in sorted(set(self.plan.widths))} if compiled else None
        self._eager_step = None if compiled else graphs["beam_step"]
        model = self.model()
        self.head_weight, self.cfg = model.lm_head, model.cfg  # [V, hidden]
        self.buffers = BeamBuffers(model.cfg, self.plan, self.head_weight.dtype, self.device)
        self.banned = torch.tensor(self.banned_ids, dtype=torch.int64, device=self.device)
        self.packed_head = head.prepack_head(self.head_weight, self.plan.max_width)
        self.status["buffers_mib"] = round(self.buffers.nbytes() / 2**20, 1)

    def step_graph(self, width: int) -> tuple[Graph, int]:
        """The decode-step graph for requests of up to `width` beams, and its row width."""
        if self._steps is None:
            return self._eager_step, width
        for bucket, graph in self._steps.items():
            if width <= bucket:
                return graph, bucket
        raise ValueError(f"width {width} exceeds the compiled buckets {list(self._steps)}")

    # --- the walk: prefill, then step 1..S, then outputs -----------------------------------

    @torch.inference_mode()
    def prefill(self, jobs: Sequence[BeamJob]) -> BeamBatch:
        """Pack the prompts, run the prefill graph, store each prompt's K/V once."""
        steps, r, p = jobs[0].steps, len(jobs), self.plan
        if any(j.steps != steps for j in jobs) or r > p.max_requests:
            raise ValueError(f"a beam batch holds 1..{p.max_requests} jobs with equal decode_steps")
        graph, width = self.step_graph(max(j.width for j in jobs))
        if max(j.width for j in jobs) > p.max_width or r * width > p.max_rows or steps > p.max_steps:
            raise ValueError(f"{r} requests x {width} beams x {steps} steps exceed the planned buffers")
        packed = self.buffers.pack.pack([list(j.prompt) for j in jobs])
        # [R, hidden]; [layers, R, Hkv, L, D]
        hidden, k, v = self._prefill(packed.tokens, packed.positions, packed.cu_seqlens,
                                     packed.pad_index, packed.last_index)
        longest = k.shape[3]
        pk, pv = self.buffers.prompt_views(r, longest)
        pk.copy_(k)
        pv.copy_(v)
        prompt_len = self.buffers.prompt_len[:r]
        prompt_len.copy_(torch.tensor([e - s for s, e in packed.spans]))
        return BeamBatch(jobs, steps, width, graph, prompt_len, longest, hidden=hidden)

    @torch.inference_mode()
    def step(self, batch: BeamBatch, j: int) -> BeamBatch:
        """Step j (1-based) chooses every beam's j-th token. Step 1 reads the prefill's last
        positions; step j > 1 runs the decode graph on the tokens chosen at step j - 1."""
        if j > batch.steps:
            return batch  # this batch generates fewer tokens than the DAG's last step
        if j == 1:
            r = batch.requests
            logp = self._head(batch.hidden)[:, None]  # [R, 1, V]: one live beam, the prompt
            cum = torch.zeros(r, 1, device=self.device)
            nodes = torch.full((r, 1), ROOT, dtype=torch.int64, device=self.device)
            batch.state = self._select(batch, logp, cum, nodes, self._empty_state(batch), 0)
            return batch
        logp = self._decode(batch, j - 1)
        batch.state = self._select(batch, logp, batch.state.scores, batch.state.nodes, batch.state, j - 1)
        return batch

    def outputs(self, batch: BeamBatch) -> list[BeamOutput]:
        out = []
        scores, history = batch.state.scores.cpu(), batch.state.history.cpu()
        for i, job in enumerate(batch.jobs):
            live = int(torch.isfinite(scores[i, : job.width]).sum())  # sorted: live rows first
            out.append(BeamOutput(history[i, :live].tolist(), scores[i, :live].tolist()))
        return out

    # --- pieces ---------------------------------------------------------------------------

    def _decode(self, batch: BeamBatch, t: int) -> Tensor:
        """Decode pass over the t-th generated tokens (t >= 1): -> log-probs [R, W, V]."""
        r, w, buf = batch.requests, batch.width, self.buffers
        b = r * w
        src, dst = buf.suffix_views((t + 1) % 2, b), buf.suffix_views(t % 2, b)
        if t > 1:  # the surviving beams' suffix K/V move to their new rows; nothing else moves
            rows = (batch.state.parents + torch.arange(r, device=self.device)[:, None] * w).reshape(b)
            for s_, d_ in zip(src, dst):
                torch.index_select(s_, 1, rows, out=d_)
        tokens, positions = buf.tokens[:b], buf.positions[:b]
        tokens.copy_(batch.state.history[:, :, t - 1].reshape(b))
        positions.copy_((batch.prompt_len[:, None] + (t - 1)).expand(r, w).reshape(b))
        pk, pv = buf.prompt_views(r, batch.longest)
        suffix_len = torch.tensor(t - 1, device=self.device)
        hidden, nk, nv = batch.step_graph(tokens, positions, pk, pv, batch.prompt_len, dst[0], dst[1],
                                          suffix_len)
        if t - 1 < self.plan.suffix_slots and t < batch.steps - 1:  # read by a later pass
            dst[0][:, :, t - 1].copy_(nk)
            dst[1][:, :, t - 1].copy_(nv)
        return self._head(hidden).view(r, w, -1)

    def _head(self, hidden: Tensor) -> Tensor:
        # hidden: [rows, hidden] -> log-probabilities [rows, V] in the planned buffer
        logp, logits = self.buffers.head_views(hidden.shape[0])
        return head.head_log_probs(hidden, self.head_weight, self.banned, logp, logits, self.packed_head)

    def _select(self, batch: BeamBatch, logp: Tensor, cum: Tensor, nodes: Tensor, state: BeamState,
                t: int) -> BeamState:
        """logp: [R, w_in, V], cum/nodes: [R, w_in] -> the next [R, W] beams, whose t-th
        token (0-based) is chosen here."""
        jobs, w = batch.jobs, state.scores.shape[1]
        scores, parents, tokens, new_nodes = select.next_beams(logp, cum, nodes, w, [j.trie for j in jobs],
                                                               [j.width for j in jobs])
        history = state.history.gather(1, parents[:, :, None].expand_as(state.history))
        history[:, :, t] = tokens
        return BeamState(scores, history, new_nodes, parents)

    def _empty_state(self, batch: BeamBatch) -> BeamState:
        r, w = batch.requests, batch.width
        z = torch.zeros(r, w, dtype=torch.int64, device=self.device)
        history = torch.zeros(r, w, batch.steps, dtype=torch.int64, device=self.device)
        return BeamState(torch.full((r, w), -math.inf, device=self.device), history, z, z)
