"""The beam_search runtime: the beam graphs (AOT-compiled or eager), the planned buffers,
and the three moves of a fixed-step walk over a batch of requests -- `prefill`, `step(j)`,
`outputs` -- which the beam task's DAG nodes call in order (tasks/beam.py).

Two programs: the beam prefill (dynamic packed tokens, prompts, prompt length) and a
decode-step graph per width bucket W (W rows a request; dynamic R requests, B = W * R rows,
prompt length P; on a CPU its attention is the native float32 kernel). A request of width w
runs in the smallest bucket W >= w (padding rows are wasted work); eagerly, at its batch's
widest. Compiled, the eager model's weights are freed but for the head (runtime/beam_head.py).
A prompt's K/V is written once, after the prefill; each beam keeps only its suffix K/V, in
two ping-pong buffers: reordering beams gathers the suffix rows into the other, nothing else
moves (a batch's state: runtime/beam_batch.py).

On a GPU the decode step (body and head) is a CUDA graph per (width bucket, requests bucket,
ping-pong parity), captured at start on the planned buffers (runtime/graphs.py): prompts lie
at the plan's prompt bound (the attention bias masks the rest), a batch runs at the smallest
requests bucket >= its requests (padding requests: masked prompts of length 1, rows never
read), and a step only fills the static inputs and replays. Nothing on the walk reads the
device before the outputs. On a CPU the same walk runs each step directly.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from engines.bounded.kernels import beam_attention, select
from engines.bounded.kernels.constraints import ROOT
from engines.bounded.model.families import read_model_config
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.plan import BeamPlan
from engines.bounded.programs.beam import BeamDecodeStep, BeamPrefill
from engines.bounded.runtime import beam_head, export, spans
from engines.bounded.runtime.beam_batch import BeamBatch, BeamJob, BeamOutput, BeamState
from engines.bounded.runtime.buffers import BeamBuffers, filler
from engines.bounded.runtime.compiled import CompiledRuntime, Graph, threads_for
from engines.bounded.runtime.graphs import Backend, CudaBackend, GraphSet


class BeamRuntime(CompiledRuntime):
    def __init__(self, model_dir: Path, policy: PrecisionPolicy, device: str, plan: BeamPlan,
                 banned: Sequence[int], compile_mode: str = "aot", log: Callable[[str], None] = print,
                 attention: str = "auto", cuda_graphs: bool = True, graph_backend: Optional[Backend] = None,
                 kernel_profile: bool = False):
        """`cuda_graphs`: capture the decode steps on a GPU; `graph_backend` captures them on
        any device instead (tests)."""
        # a beam prefill packs at most the plan's requests' prompts (few, on the common plans)
        # of at most the prompt bound
        super().__init__(model_dir, policy, device, compile_mode, log, attention, plan.max_requests, plan.max_prompt,
                         kernel_profile)
        self.plan, self.banned_ids = plan, list(banned)
        self.status["step_attention"] = self.step_attention = beam_attention.step_attention_for(self.device, log)
        self.cuda_graphs, self.graph_backend = cuda_graphs, graph_backend
        self.buffers: Optional[BeamBuffers] = None
        self._calls: dict[tuple, Callable[[], tuple]] = {}  # uncaptured decode calls by shape
        self.graphs: Optional[GraphSet] = None

    # --- build ----------------------------------------------------------------------------

    def max_positions(self) -> int:
        return self.plan.max_positions

    def exports(self) -> list[export.Export]:
        p, d = self.plan, self.device
        cfg = read_model_config(self.model_dir)
        steps = [export.beam_step(p, w, cfg, lambda: self._program(BeamDecodeStep), d) for w in sorted(set(p.widths))]
        tail = [export.beam_head_tail(p, cfg.vocab, len(self.banned_ids), getattr(torch, self.policy.dtype),
                                      lambda: beam_head.tail_program(cfg.vocab), d)] if self._summarised() else []
        return [export.beam_prefill(p, lambda: self._program(BeamPrefill), d), *steps, *tail]

    def eager_graphs(self) -> dict[str, Graph]:
        graphs = {"beam_prefill": self._program(BeamPrefill), "beam_step": self._program(BeamDecodeStep)}
        tail = beam_head.tail_program(read_model_config(self.model_dir).vocab) if self._summarised() else None
        return {**graphs, beam_head.TAIL: tail} if tail is not None else graphs

    def _summarised(self) -> bool:
        return beam_head.summarised(self.device, self.policy, len(self.banned_ids))

    def serve(self, graphs: dict[str, Graph], compiled: bool) -> None:
        self._prefill = graphs["beam_prefill"]
        # width bucket -> step graph; eagerly one graph that runs at any width
        self._steps = {w: graphs[f"beam_step_w{w}"] for w in sorted(set(self.plan.widths))} if compiled else None
        self._eager_step = None if compiled else graphs["beam_step"]
        model, tail = self.model(), graphs.get(beam_head.TAIL)  # tail None: float32 log-probabilities
        self.cfg, self.buffers = model.cfg, BeamBuffers(model.cfg, self.plan, model.lm_head.dtype, self.device)
        banned = torch.tensor(self.banned_ids, dtype=torch.int64, device=self.device)
        self.head = beam_head.BeamHead(model.lm_head, banned, self.buffers, self.policy, self.plan.max_width, tail,
                                       fuse=self.graph_backend is None)  # a captured step: tensors out
        unfused = "logit summary" if tail is not None else "float32 log-probabilities"
        self.status["head_tail"] = "native fused head + top-k" if self.head.fused else unfused
        self.status["buffers_mib"] = round(self.buffers.nbytes() / 2**20, 1)
        self._capture_steps()

    def _capture_steps(self) -> None:
        """CUDA graphs of every decode step shape the plan allows, or why there are none."""
        backend = self.graph_backend
        if backend is None and self.device.type == "cuda" and self.cuda_graphs:
            backend = CudaBackend(self.device)
        if backend is None:
            self.status["cuda_graphs"] = "off" if self.device.type == "cuda" else f"n/a ({self.device.type})"
            return
        graphs, keys = GraphSet(backend), []
        try:
            with torch.inference_mode():
                for w in sorted(set(self.plan.widths)):
                    step, _ = self.step_graph(w)
                    for rows in self.plan.request_buckets(w):
                        for parity in (0, 1):
                            graphs.capture((w, rows, parity), self._step_call(step, w, rows, parity,
                                                                               self.plan.max_prompt))
                            keys.append(f"w{w}xr{rows}p{parity}")
        except Exception as e:  # a capture that fails leaves the steps running uncaptured
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            self.log(f"CUDA graph capture of the beam steps failed, running them uncaptured: {reason}")
            self.status["cuda_graphs"] = {"captured": 0, "fallback_reason": reason}
            return
        self.graphs = graphs
        self.status["cuda_graphs"] = {"captured": len(keys), "shapes": keys,
                                      "outputs_mib": round(graphs.nbytes() / 2**20, 1)}

    def _program(self, cls):
        return cls(self.model(), self.step_attention if cls is BeamDecodeStep else self.attention).eval()

    def step_graph(self, width: int) -> tuple[Graph, int]:
        """The decode-step graph for requests of up to `width` beams, and its row width: the
        smallest width bucket >= width (compiled or captured graphs have fixed widths), or
        eagerly and uncaptured the batch's own width."""
        if self._steps is None and self.graphs is None:
            return self._eager_step, width
        for bucket in sorted(set(self.plan.widths)):
            if width <= bucket:
                return (self._eager_step if self._steps is None else self._steps[bucket]), bucket
        raise ValueError(f"width {width} exceeds the width buckets {sorted(set(self.plan.widths))}")

    # --- the walk: prefill, then step 1..S, then outputs -----------------------------------

    @torch.inference_mode()
    def prefill(self, jobs: Sequence[BeamJob]) -> BeamBatch:
        """Pack the prompts, run the prefill graph, store each prompt's K/V once, and fix the
        batch's shapes and device metadata for every step."""
        steps, r, p, buf = jobs[0].steps, len(jobs), self.plan, self.buffers
        if any(j.steps != steps for j in jobs) or r > p.max_requests:
            raise ValueError(f"a beam batch holds 1..{p.max_requests} jobs with equal decode_steps")
        graph, width = self.step_graph(max(j.width for j in jobs))
        if max(j.width for j in jobs) > p.max_width or r * width > p.max_rows or steps > p.max_steps:
            raise ValueError(f"{r} requests x {width} beams x {steps} steps exceed the planned buffers")
        prompts = [list(j.prompt) for j in jobs]
        extra = filler(sum(map(len, prompts)), r, p.max_requests * p.max_prompt, p.max_requests, p.max_prompt) \
            if self.device.type == "cpu" else 0
        packed = buf.pack.pack(prompts + [[0] * extra] * (extra > 0))  # a filler prompt rounds the tokens up
        # [R, hidden]; [layers, R, Hkv, L, D] (the filler's row, if any, dropped)
        with threads_for(self.device, packed.num_tokens * self.cfg.token_flops):
            hidden, k, v = self._prefill(*packed.varlen_args())
        hidden, k, v = hidden[:r], k[:, :r], v[:, :r]
        longest = k.shape[3]
        rows = self._rows_bucket(r, width)
        stride = p.max_prompt if self.graphs is not None else longest
        pk, pv = buf.prompt_views(rows, stride)
        if (rows, stride) == (r, longest):
            pk.copy_(k)
            pv.copy_(v)
        else:
            pk[:, :r, :, :longest].copy_(k)
            pv[:, :r, :, :longest].copy_(v)
        prompt_len = buf.prompt_len[:rows]
        prompt_len[:r].copy_(packed.cu_seqlens[1:r + 1] - packed.cu_seqlens[:r])
        if rows > r:  # padding requests: one valid (stale) key, so their rows stay finite
            prompt_len[r:].fill_(1)
            buf.rows[r * width:rows * width].copy_(torch.arange(r * width, rows * width, device=self.device))
        choice = select.prepare_choice([j.trie for j in jobs], [j.width for j in jobs], width,
                                       buf.pack.staging.put)
        row_base = (torch.arange(r, device=self.device) * width)[:, None]
        return BeamBatch(jobs, steps, width, graph, rows, stride, prompt_len, choice, row_base, hidden=hidden)

    def _rows_bucket(self, r: int, width: int) -> int:
        if self.graphs is None:
            return r
        return next(b for b in self.plan.request_buckets(width) if b >= r)

    @torch.inference_mode()
    def step(self, batch: BeamBatch, j: int) -> BeamBatch:
        """Step j (1-based) chooses every beam's j-th token. Step 1 reads the prefill's last
        positions; step j > 1 runs the decode graph on the tokens chosen at step j - 1."""
        if j > batch.steps:
            return batch  # this batch generates fewer tokens than the DAG's last step
        if j == 1:
            r = batch.requests
            logp = beam_head.view(self.head(batch.hidden), r, 1)  # [R, 1, V]: one live beam, the prompt
            cum = torch.zeros(r, 1, device=self.device)
            nodes = torch.full((r, 1), ROOT, dtype=torch.int64, device=self.device)
            batch.state = self._select(batch, logp, cum, nodes, BeamState.empty(batch.requests, batch.width, batch.steps, self.device), 0)
            return batch
        logp = self._decode(batch, j - 1)
        batch.state = self._select(batch, logp, batch.state.scores, batch.state.nodes, batch.state, j - 1)
        return batch

    def outputs(self, batch: BeamBatch) -> list[BeamOutput]:
        out = []
        scores, history = batch.state.scores.cpu(), batch.state.history.cpu()  # the result is read here
        for i, job in enumerate(batch.jobs):
            live = int(torch.isfinite(scores[i, : job.width]).sum())  # sorted: live rows first
            out.append(BeamOutput(history[i, :live].tolist(), scores[i, :live].tolist()))
        return out

    # --- pieces ---------------------------------------------------------------------------

    def _step_call(self, step: Graph, w: int, rows: int, parity: int, stride: int) -> Callable[[], tuple]:
        """One decode pass on the planned buffers of `rows` requests of `w` rows, reading the
        suffix K/V of ping-pong buffer `parity` -> (log-probs [rows*W, V], new K, new V): the
        call a CUDA graph captures (every tensor it touches is a fixed view of the buffers)."""
        buf, b = self.buffers, rows * w
        tokens, positions = buf.tokens[:b], buf.positions[:b]
        pk, pv = buf.prompt_views(rows, stride)
        prompt_len, (sk, sv) = buf.prompt_len[:rows], buf.suffix_views(parity, b)

        body = b * self.cfg.token_flops

        def call() -> tuple[Tensor, Tensor, Tensor]:
            with threads_for(self.device, body):
                hidden, nk, nv = step(tokens, positions, pk, pv, prompt_len, sk, sv, buf.suffix_len)
            return self.head(hidden), nk, nv
        return call

    def _decode(self, batch: BeamBatch, t: int) -> Tensor:
        """Decode pass over the t-th generated tokens (t >= 1): -> log-probs [R, W, V]."""
        r, w, rows, buf = batch.requests, batch.width, batch.rows, self.buffers
        b, padded = r * w, rows * w
        parity = t % 2
        src, dst = buf.suffix_views(1 - parity, padded), buf.suffix_views(parity, padded)
        if t > 1:  # the surviving beams' suffix K/V move to their new rows; nothing else moves
            order = buf.rows[:padded]  # past b: the padding rows, in place
            order[:b].copy_((batch.state.parents + batch.row_base).reshape(b))
            for s_, d_ in zip(src, dst):
                torch.index_select(s_, 1, order, out=d_)
        buf.tokens[:b].copy_(batch.state.history[:, :, t - 1].reshape(b))
        buf.positions[:padded].copy_((batch.prompt_len[:, None] + (t - 1)).expand(rows, w).reshape(padded))
        buf.suffix_len.fill_(t - 1)
        if self.graphs is not None:
            logp, nk, nv = self.graphs.replay((w, rows, parity))
        else:
            key = (batch.step_graph, w, rows, parity, batch.prompt_stride)  # the buffers' views: once a shape
            call = self._calls.get(key) or self._calls.setdefault(key, self._step_call(*key))
            logp, nk, nv = call()
        if t - 1 < self.plan.suffix_slots and t < batch.steps - 1:  # read by a later pass
            dst[0][:, :, t - 1].copy_(nk)
            dst[1][:, :, t - 1].copy_(nv)
        return beam_head.view(logp, rows, w).requests(slice(0, r)) if not isinstance(logp, Tensor) \
            else logp.view(rows, w, -1)[:r]

    def _select(self, batch: BeamBatch, logp: Tensor, cum: Tensor, nodes: Tensor, state: BeamState,
                t: int) -> BeamState:
        """logp: [R, w_in, V], cum/nodes: [R, w_in] -> the next [R, W] beams, whose t-th
        token (0-based) is chosen here (their parents' trie nodes lie at depth t)."""
        with spans.span("bounded::select"):
            scores, parents, tokens, new_nodes = select.next_beams(logp, cum, nodes, batch.choice, depth=t)
        history = state.history.gather(1, parents[:, :, None].expand_as(state.history))
        history[:, :, t] = tokens
        return BeamState(scores, history, new_nodes, parents)
