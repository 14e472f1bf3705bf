"""The beam runtime's graphs, eager or compiled ahead of time with AOTInductor (aot.py's
cache), and `BeamRuntime`, which owns them with the planned buffers.

Two programs: the beam prefill (dynamic packed tokens, prompts, prompt length) and one
decode-step graph per width bucket W (fixed W rows per request; dynamic number of requests
R, so B = W * R rows, and dynamic prompt length P). They are compiled with Inductor's
freezing: the weights become constants of the package, prepacked for the CPU's GEMM library
(oneDNN), which runs the M = W row GEMMs of a decode step ~20% faster than aten's
plain-layout matmul here.

A request of width w runs in the smallest compiled bucket W >= w (the padding rows are
wasted work). Once compiled, the eager model's weights are freed but for the head, which
the runner applies outside the graphs.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.export import Dim

from engines.bounded import aot
from engines.bounded.beam_programs import BeamDecodeStep, BeamPrefill, head_weight
from engines.bounded.beam_runtime import BeamGraphs, BeamJob, BeamPlan, BeamRunner, Graph
from engines.bounded.config import ModelConfig, PrecisionPolicy
from engines.bounded.model import DecoderModel
from engines.bounded.weights import fingerprint

# Inductor settings of the beam packages (part of their cache key)
INDUCTOR_CONFIGS = {"freezing": True}


@dataclass(frozen=True)
class BeamShapes:
    """The shape policy of one beam package (part of its cache key)."""

    width: int  # rows per request of a step graph (0: the prefill)
    max_requests: int
    max_prompt: int
    suffix_slots: int
    max_positions: int  # rows of the rotary tables baked into the graph


class CompiledBeamGraphs(BeamGraphs):
    def __init__(self, prefill: Graph, steps: dict[int, Graph]):
        self._prefill, self.steps = prefill, dict(sorted(steps.items()))

    def step(self, width: int) -> tuple[Graph, int]:
        for bucket, graph in self.steps.items():
            if width <= bucket:
                return graph, bucket
        raise ValueError(f"width {width} exceeds the compiled buckets {list(self.steps)}")


def eager_graphs(model: DecoderModel) -> BeamGraphs:
    return BeamGraphs(BeamPrefill(model).eval(), BeamDecodeStep(model).eval())


def compile_graphs(model: DecoderModel, model_dir: Path, policy: PrecisionPolicy, plan: BeamPlan,
                   widths: Sequence[int], log: Callable[[str], None]) -> tuple[CompiledBeamGraphs, dict]:
    """Load (compiling on a cache miss) the prefill and one step graph per width."""
    cfg, status = model.cfg, {}
    max_positions = model.rope.cos.shape[0]
    prefill_shapes = BeamShapes(0, plan.max_requests, plan.max_prompt, plan.suffix_slots, max_positions)
    prefill = _load(model, BeamPrefill(model).eval(), "beam_prefill", prefill_shapes, model_dir, policy,
                    _prefill_example(plan, model.rope.cos.device), _prefill_dims(plan), log, status)
    steps = {}
    for w in sorted(set(widths)):
        shapes = BeamShapes(w, max(1, plan.max_rows // w), plan.max_prompt, plan.suffix_slots, max_positions)
        steps[w] = _load(model, BeamDecodeStep(model).eval(), f"beam_step_w{w}", shapes, model_dir, policy,
                         _step_example(cfg, shapes, model.rope.cos.device), _step_dims(shapes), log, status)
    return CompiledBeamGraphs(prefill, steps), status


def _load(model: DecoderModel, program: nn.Module, name: str, shapes: BeamShapes, model_dir: Path,
          policy: PrecisionPolicy, example: tuple, dims: tuple, log, status: dict) -> Graph:
    key = aot.CompileKey(name, fingerprint(model_dir), policy.dtype, policy.residual,
                         ",".join(f"{g}={k}" for g, k in sorted(policy.gemm.items())),
                         aot.device_tag(model.rope.cos.device), torch.__version__, shapes,  # type: ignore[arg-type]
                         inductor=json.dumps(INDUCTOR_CONFIGS, sort_keys=True))
    loaded = aot.load_or_compile(key, lambda: program, example, dims, log, INDUCTOR_CONFIGS)
    status[name] = {"package": str(loaded.path), "compiled_now": loaded.compiled_now,
                    "load_s": round(loaded.seconds, 2)}
    return loaded.runner


# --- export examples and dynamic dims: >= 2 and distinct sizes, so export specialises none --


def _prefill_example(plan: BeamPlan, device: torch.device) -> tuple[Tensor, ...]:
    # >= 2 distinct sizes per dynamic dim so export specialises none, and typical ones,
    # since Inductor tunes its kernels for the example's sizes
    from engines.bounded.packing import PackBuffers

    n = max(2, min(plan.max_requests, 4))
    length = max(3, min(plan.max_prompt, 96))
    lengths = [length - (i % 2) for i in range(n)]  # T != R * L, so no two dims unify
    b = PackBuffers(sum(lengths), n, length, device).pack([[1] * m for m in lengths])
    return tuple(t.clone() for t in (b.tokens, b.positions, b.cu_seqlens, b.pad_index, b.last_index))


def _prefill_dims(plan: BeamPlan) -> tuple:
    t = Dim("tokens", min=1, max=max(2, plan.max_requests) * max(3, plan.max_prompt))
    r = Dim("prompts", min=1, max=max(2, plan.max_requests))
    longest = Dim("longest", min=1, max=max(3, plan.max_prompt))
    return ({0: t}, {0: t}, {0: r + 1}, {0: r, 1: longest}, {0: r})


def _step_example(cfg: ModelConfig, s: BeamShapes, device: torch.device) -> tuple[Any, ...]:
    r, p = 2, max(3, min(s.max_prompt, 96))  # a typical prompt length (Inductor tunes for it)
    b = r * s.width
    kv = (cfg.layers, r, cfg.kv_heads, p, cfg.head_dim)
    suffix = (cfg.layers, b, s.suffix_slots, cfg.kv_heads, cfg.head_dim)
    f32 = dict(dtype=torch.float32, device=device)
    i64 = dict(dtype=torch.int64, device=device)
    return (torch.zeros(b, **i64), torch.full((b,), p, **i64), torch.zeros(kv, **f32), torch.zeros(kv, **f32),
            torch.tensor([p, p - 2], **i64), torch.zeros(suffix, **f32), torch.zeros(suffix, **f32),
            torch.tensor(1, **i64))


def _step_dims(s: BeamShapes) -> tuple:
    r = Dim("requests", min=1, max=max(2, s.max_requests))
    p = Dim("prompt", min=1, max=max(3, s.max_prompt))
    b = s.width * r
    return ({0: b}, {0: b}, {1: r, 3: p}, {1: r, 3: p}, {0: r}, {1: b}, {1: b}, None)


class BeamRuntime:
    """The beam half of the engine's runtime: the model, its graphs (compiled, or eager as a
    fallback) and the runner with its planned buffers, all made at `start`."""

    def __init__(self, model_dir: Path, policy: PrecisionPolicy, device: str, plan: BeamPlan,
                 banned: Sequence[int], compile_mode: str = "aot", log: Callable[[str], None] = print):
        self.model_dir, self.policy, self.plan, self.banned = Path(model_dir), policy, plan, list(banned)
        self.device, self.compile_mode, self.log = torch.device(device), compile_mode, log
        self.status: dict[str, Any] = {"compile": compile_mode}
        self.runner: Optional[BeamRunner] = None
        self._model: Optional[DecoderModel] = None

    def model(self) -> DecoderModel:
        if self._model is None:
            from engines.bounded.model import load_model

            self._model = load_model(self.model_dir, self.policy, self.device,
                                     max_positions=self.plan.max_prompt + self.plan.max_steps)
        return self._model

    def compile(self) -> dict[str, Any]:
        """Load the packages for this plan, compiling them on a cache miss."""
        graphs, packages = compile_graphs(self.model(), self.model_dir, self.policy, self.plan,
                                          [self.plan.max_width], self.log)
        self.status.update(compile="aot", packages=packages)
        return graphs

    def start(self) -> None:
        graphs: Optional[BeamGraphs] = None
        if self.compile_mode == "aot":
            try:
                graphs = self.compile()
            except Exception as e:  # no compiler, unsupported op, ...: serve eagerly
                reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                self.log(f"AOT compilation of the beam graphs failed, falling back to eager: {reason}")
                self.status.update(compile="eager", fallback_reason=reason)
        model = self.model()
        self.runner = BeamRunner(model.cfg, self.plan, graphs or eager_graphs(model), head_weight(model),
                                 self.banned)
        if graphs is not None:
            self._model = None  # the packages hold their own weights; the runner keeps the head's
        self.status["buffers_mib"] = round(self.runner.buffers.nbytes() / 2**20, 1)
        self._warm_up()

    def _warm_up(self) -> None:
        t0 = time.perf_counter()
        p = self.plan
        prompt = [0] * min(p.max_prompt, 7)
        with torch.inference_mode():
            self.runner.run([BeamJob(prompt, p.max_width, p.max_steps)] * p.max_requests)
        self.status["warmup_s"] = round(time.perf_counter() - t0, 3)
