"""Beam-search runtime: planned buffers, and the fixed-step walk prefill -> step x S for a
batch of business requests (several requests' beams share each decode step).

Buffers are sized once from the bounds (requests per batch, beam width, steps, prompt
tokens). The prompt K/V of each request is written once, after the prefill; each beam keeps
only its suffix K/V, in two ping-pong buffers: reordering beams after a step gathers the
suffix rows into the other buffer, and nothing else moves.

Row layout of a batch: request r owns rows [r*W, (r+1)*W) of the W-row width bucket; rows
past its own width, and beams that died (no allowed continuation), carry score -inf and are
never chosen.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from engines.bounded import beam
from engines.bounded.config import ModelConfig
from engines.bounded.constraints import ROOT, ItemTrie
from engines.bounded.packing import PackBuffers


@dataclass(frozen=True)
class BeamJob:
    prompt: Sequence[int]
    width: int
    steps: int
    trie: Optional[ItemTrie] = None


@dataclass
class BeamOutput:
    tokens: list[list[int]]  # generated tokens of each beam, best first
    scores: list[float]  # cumulative log-probabilities, same order


@dataclass(frozen=True)
class BeamPlan:
    """What the buffers are sized for."""

    max_requests: int  # requests whose beams share one decode step
    max_width: int
    max_steps: int
    max_prompt: int

    @property
    def max_rows(self) -> int:
        return self.max_requests * self.max_width

    @property
    def suffix_slots(self) -> int:
        # pass j (1..S-1) reads the K/V of generated tokens 1..j-1
        return max(self.max_steps - 2, 1)


class BeamBuffers:
    """K/V and index buffers for `plan`, allocated once; batches use contiguous prefixes."""

    def __init__(self, cfg: ModelConfig, plan: BeamPlan, dtype: torch.dtype, device: torch.device):
        self.cfg, self.plan = cfg, plan
        f32 = dict(dtype=torch.float32, device=device)
        per_prompt = cfg.layers * cfg.kv_heads * plan.max_prompt * cfg.head_dim
        per_row = cfg.layers * plan.suffix_slots * cfg.kv_heads * cfg.head_dim
        self.prompt_kv = [torch.zeros(plan.max_requests * per_prompt, **f32) for _ in range(2)]
        self.suffix_kv = [[torch.zeros(plan.max_rows * per_row, **f32) for _ in range(2)]
                          for _ in range(2)]  # [ping|pong][k|v]
        self.pack = PackBuffers(plan.max_requests * plan.max_prompt, plan.max_requests,
                                plan.max_prompt, device)
        # the head: log-probabilities of every row (float32), and its GEMM's own output dtype
        self.logp = torch.zeros(plan.max_rows * cfg.vocab, **f32)
        self.logits = None if dtype == torch.float32 else \
            torch.zeros(plan.max_rows * cfg.vocab, dtype=dtype, device=device)
        i64 = dict(dtype=torch.int64, device=device)
        self.tokens = torch.zeros(plan.max_rows, **i64)
        self.positions = torch.zeros(plan.max_rows, **i64)
        self.prompt_len = torch.zeros(plan.max_requests, **i64)

    def nbytes(self) -> int:
        flat = [*self.prompt_kv, *(t for pair in self.suffix_kv for t in pair), self.logp]
        flat += [self.logits] if self.logits is not None else []
        return sum(t.numel() * t.element_size() for t in flat)

    def prompt_views(self, r: int, p: int) -> tuple[Tensor, Tensor]:
        c = self.cfg
        shape = (c.layers, r, c.kv_heads, p, c.head_dim)
        n = math.prod(shape)
        return tuple(t[:n].view(shape) for t in self.prompt_kv)  # type: ignore[return-value]

    def head_views(self, b: int) -> tuple[Tensor, Optional[Tensor]]:
        n = b * self.cfg.vocab
        logits = None if self.logits is None else self.logits[:n].view(b, -1)
        return self.logp[:n].view(b, -1), logits

    def suffix_views(self, which: int, b: int) -> tuple[Tensor, Tensor]:
        c = self.cfg
        shape = (c.layers, b, self.plan.suffix_slots, c.kv_heads, c.head_dim)
        n = math.prod(shape)
        return tuple(t[:n].view(shape) for t in self.suffix_kv[which])  # type: ignore[return-value]


@dataclass
class BeamState:
    """The beams of a batch between steps: [R, W] each."""

    scores: Tensor  # float32 cumulative log-probability, -inf for dead/padding rows
    history: Tensor  # [R, W, S] int64 generated tokens so far
    nodes: Tensor  # trie node per beam (constrained requests)
    parents: Tensor  # row within the request of each beam's parent at the last step


Graph = Callable[..., tuple[Tensor, Tensor, Tensor]]


class BeamGraphs:
    """The graphs the runner calls. This default runs the programs eagerly at any shape; a
    compiled provider (beam_graphs.py) answers with loaded graphs per width bucket."""

    def __init__(self, prefill: Graph, step: Graph):
        self._prefill, self._step = prefill, step

    def prefill(self) -> Graph:
        return self._prefill

    def step(self, width: int) -> tuple[Graph, int]:
        """The decode-step graph for requests of up to `width` beams, and its row width."""
        return self._step, width


@dataclass
class BeamBatch:
    """One batch between stages: its jobs, the shapes chosen for it, and its beams."""

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


class BeamRunner:
    """The fixed-step walk for a batch of BeamJobs with equal decode_steps:
    prefill -> step 1 (the prompt's last position) -> step 2..S (decode graph) -> outputs."""

    def __init__(self, cfg: ModelConfig, plan: BeamPlan, graphs: BeamGraphs, head_weight: Tensor,
                 banned: Sequence[int]):
        self.cfg, self.plan, self.graphs = cfg, plan, graphs
        self.head_weight, self.device = head_weight, head_weight.device  # [V, hidden]
        self.buffers = BeamBuffers(cfg, plan, head_weight.dtype, head_weight.device)
        self.banned = torch.tensor(list(banned), dtype=torch.int64, device=self.device)
        self.packed_head = beam.prepack_head(head_weight, plan.max_width)

    def run(self, jobs: Sequence[BeamJob], stages: Optional[dict[str, float]] = None) -> list[BeamOutput]:
        stages = {} if stages is None else stages
        t0 = time.perf_counter()
        batch = self.prefill(jobs)
        t0 = _lap(stages, "prefill", t0)
        for j in range(1, batch.steps + 1):
            self.step(batch, j)
            t0 = _lap(stages, f"step{j}", t0)
        return self.outputs(batch)

    # --- stages --------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, jobs: Sequence[BeamJob]) -> BeamBatch:
        """Pack the prompts, run the prefill graph, store each prompt's K/V once."""
        steps, r = jobs[0].steps, len(jobs)
        if any(j.steps != steps for j in jobs) or r > self.plan.max_requests:
            raise ValueError(f"a beam batch holds 1..{self.plan.max_requests} jobs with equal decode_steps")
        graph, width = self.graphs.step(max(j.width for j in jobs))
        if max(j.width for j in jobs) > self.plan.max_width or r * width > self.plan.max_rows \
                or steps > self.plan.max_steps:
            raise ValueError(f"{r} requests x {width} beams x {steps} steps exceed the planned buffers")
        packed = self.buffers.pack.pack([list(j.prompt) for j in jobs])
        # [R, hidden]; [layers, R, Hkv, L, D]
        hidden, k, v = self.graphs.prefill()(packed.tokens, packed.positions, packed.cu_seqlens,
                                             packed.pad_index, packed.last_index)
        longest = k.shape[3]
        pk, pv = self.buffers.prompt_views(r, longest)
        pk.copy_(k)
        pv.copy_(v)
        prompt_len = self.buffers.prompt_len[:r]
        prompt_len.copy_(torch.tensor([e - s for s, e in packed.spans]))
        return BeamBatch(jobs, steps, width, graph, prompt_len, longest, hidden=hidden)

    @torch.inference_mode()
    def step(self, batch: BeamBatch, j: int) -> None:
        """Step j (1-based) chooses every beam's j-th token. Step 1 reads the prefill's last
        positions; step j > 1 runs the decode graph on the tokens chosen at step j - 1."""
        if j > batch.steps:
            return  # this batch generates fewer tokens than the DAG's last step
        if j == 1:
            r = batch.requests
            logp = self._head(batch.hidden)[:, None]  # [R, 1, V]: one live beam, the prompt
            cum = torch.zeros(r, 1, device=self.device)
            nodes = torch.full((r, 1), ROOT, dtype=torch.int64, device=self.device)
            batch.state = self._select(batch, logp, cum, nodes, self._empty_state(batch), 0)
            return
        logp = self._decode(batch, j - 1)
        batch.state = self._select(batch, logp, batch.state.scores, batch.state.nodes, batch.state, j - 1)

    def outputs(self, batch: BeamBatch) -> list[BeamOutput]:
        out = []
        scores, history = batch.state.scores.cpu(), batch.state.history.cpu()
        for i, job in enumerate(batch.jobs):
            live = int(torch.isfinite(scores[i, : job.width]).sum())  # sorted: live rows first
            out.append(BeamOutput(history[i, :live].tolist(), scores[i, :live].tolist()))
        return out

    # --- pieces --------------------------------------------------------------------------

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
        return beam.head_log_probs(hidden, self.head_weight, self.banned, logp, logits, self.packed_head)

    def _select(self, batch: BeamBatch, logp: Tensor, cum: Tensor, nodes: Tensor, state: BeamState,
                t: int) -> BeamState:
        """logp: [R, w_in, V], cum/nodes: [R, w_in] -> the next [R, W] beams, whose t-th
        token (0-based) is chosen here."""
        jobs, (r, w) = batch.jobs, state.scores.shape
        scores = torch.full((r, w), -math.inf, device=self.device)
        parents, tokens, new_nodes = (torch.zeros(r, w, dtype=torch.int64, device=self.device) for _ in range(3))
        free = [i for i, job in enumerate(jobs) if job.trie is None]
        if free:
            k = min(w, logp.shape[1] * logp.shape[2])
            idx = torch.tensor(free, device=self.device)
            args = (logp, cum) if len(free) == r else (logp[idx], cum[idx])
            scores[idx, :k], parents[idx, :k], tokens[idx, :k] = beam.top_continuations(*args, k)
        for i, job in enumerate(jobs):
            if job.trie is not None:
                sc, par, tok, nod = _constrained(job.trie, logp[i], cum[i], nodes[i], w)
                n = sc.shape[0]
                scores[i, :n], parents[i, :n], tokens[i, :n], new_nodes[i, :n] = sc, par, tok, nod
            scores[i, job.width:] = -math.inf  # rows past the request's own width
        history = state.history.gather(1, parents[:, :, None].expand_as(state.history))
        history[:, :, t] = tokens
        return BeamState(scores, history, new_nodes, parents)

    def _empty_state(self, batch: BeamBatch) -> BeamState:
        r, w = batch.requests, batch.width
        z = torch.zeros(r, w, dtype=torch.int64, device=self.device)
        history = torch.zeros(r, w, batch.steps, dtype=torch.int64, device=self.device)
        return BeamState(torch.full((r, w), -math.inf, device=self.device), history, z, z)


def _constrained(trie: ItemTrie, logp: Tensor, cum: Tensor, nodes: Tensor, w: int):
    """One request: logp [w_in, V], cum/nodes [w_in] -> the best <= w continuations that stay
    on the trie: scores, parent rows, tokens, trie nodes (best first)."""
    live = torch.nonzero(torch.isfinite(cum)).flatten()
    c = trie.continuations(nodes[live])
    parent = live[c.beam]
    total = cum[parent] + logp[parent, c.token]  # [C]
    total, order = torch.topk(total, min(w, total.shape[0]))
    keep = torch.isfinite(total)
    order = order[keep]
    return total[keep], parent[order], c.token[order], c.node[order]


def _lap(stages: dict[str, float], name: str, t0: float) -> float:
    t = time.perf_counter()
    stages[name] = (t - t0) * 1e3
    return t
