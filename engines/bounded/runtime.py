"""The prefill runtime: planned buffers and the score graph (AOT-compiled or eager).

Everything sized here comes from the shape policy (the declared bounds and the batch token
budget) and is allocated at `start`; a call only fills a prefix of the buffers. Compiling
is separate from serving: `compile()` only makes sure the cached package exists, so a
`bench compile` command can run it ahead of time.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from engines.bounded import aot, kernels  # kernels registers the ops the packages call
from engines.bounded.config import PrecisionPolicy
from engines.bounded.packing import PackBuffers, PackedBatch
from engines.bounded.weights import fingerprint

COMPILE_MODES = ("aot", "eager")
PROGRAM = "score_prefill"
# freezing: the weights become constants of the package, prepacked for oneDNN (+3-5% on
# prefill-sized GEMMs on this CPU)
INDUCTOR_CONFIGS: dict[str, Any] = {"freezing": True}


class PrefillRuntime:
    def __init__(self, model_dir: Path, policy: PrecisionPolicy, device: str, shapes: aot.ShapePolicy,
                 compile_mode: str = "aot", log: Callable[[str], None] = print,
                 inductor_configs: Optional[dict[str, Any]] = None):
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile mode {compile_mode!r}; choose one of {', '.join(COMPILE_MODES)}")
        self.model_dir, self.policy, self.shapes, self.log = Path(model_dir), policy, shapes, log
        self.device = torch.device(device)
        self.requested = compile_mode
        self.inductor_configs = dict(INDUCTOR_CONFIGS if inductor_configs is None else inductor_configs)
        self.status: dict[str, Any] = {"compile": compile_mode, "compile_requested": compile_mode}
        self._graph: Optional[Callable[..., Tensor]] = None
        self._program: Optional[torch.nn.Module] = None
        self.buffers: Optional[PackBuffers] = None

    # --- build --------------------------------------------------------------------------

    def key(self) -> aot.CompileKey:
        p = self.policy
        return aot.CompileKey(PROGRAM, fingerprint(self.model_dir), p.dtype, p.residual,
                              ",".join(f"{g}={k}" for g, k in sorted(p.gemm.items())),
                              aot.device_tag(self.device), torch.__version__, self.shapes,
                              inductor=json.dumps(self.inductor_configs, sort_keys=True))

    def program(self) -> torch.nn.Module:
        """The eager ScorePrefill module (loads the weights on first use)."""
        if self._program is None:
            from engines.bounded.model import load_model
            from engines.bounded.programs import ScorePrefill

            model = load_model(self.model_dir, self.policy, self.device, max_positions=self.shapes.max_len)
            self._program = ScorePrefill(model).eval()
        return self._program

    def compile(self) -> dict[str, Any]:
        """Load the AOT package for this key, compiling it if the cache has none."""
        key = self.key()
        loaded = aot.load_or_compile(key, self.program, self._example_args(), self._dynamic_shapes(),
                                     self.log, self.inductor_configs)
        self._graph = loaded.runner
        self._program = None  # the package holds its own weights; free the eager copy
        self.status.update(compile="aot", package=str(loaded.path), compiled_now=loaded.compiled_now,
                           load_s=round(loaded.seconds, 2), key=key.digest())
        return dict(self.status)

    def start(self) -> None:
        s = self.shapes
        self.buffers = PackBuffers(s.max_tokens, s.max_seqs, s.max_len, self.device)
        if self.requested == "aot":
            try:
                self.compile()
            except Exception as e:  # no compiler, unsupported op, ...: serve eagerly
                reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                self.log(f"AOT compilation failed, falling back to eager: {reason}")
                self.status.update(compile="eager", fallback_reason=reason)
        if self._graph is None:
            program = self.program()
            self._graph = program
        self._warm_up()

    def _warm_up(self) -> None:
        t0 = time.perf_counter()
        s = self.shapes  # a small call: first-call initialisation off the request path
        n = min(s.max_seqs, 3)
        lengths = [max(1, min(s.max_len, 7, s.max_tokens // n))] * n
        self.run(self.buffers.pack([[0] * n for n in lengths]), torch.tensor([0, 1]))
        self.status["warmup_s"] = round(time.perf_counter() - t0, 3)

    # --- serve --------------------------------------------------------------------------

    def pack(self, seqs: Sequence[Sequence[int]]) -> PackedBatch:
        return self.buffers.pack(seqs)

    def run(self, batch: PackedBatch, label_ids: Tensor) -> Tensor:
        """-> label logits [S, N] float32 on the CPU."""
        labels = label_ids.to(self.device)
        with torch.inference_mode():
            out = self._graph(*batch.varlen_args(), labels)
        return out.float().cpu()

    # --- export helpers -----------------------------------------------------------------

    def _example_args(self) -> tuple[Tensor, ...]:
        # distinct, >= 2 sizes for every dynamic dim, so export specialises none of them; a
        # typical size, since Inductor tunes its kernels for the example's sizes
        s = self.shapes
        n = max(2, min(s.max_seqs, 15, s.max_tokens // 2))
        length = max(2, min(s.max_len, 96, s.max_tokens // n))
        lengths = [length - (i % 2) for i in range(n)]  # T != S * L, so no two dims unify
        b = PackBuffers(sum(lengths), n, length, self.device).pack([[1] * m for m in lengths])
        return (*(t.clone() for t in b.varlen_args()), torch.tensor([1, 2], device=self.device))

    def _dynamic_shapes(self) -> tuple:
        d = self.shapes.dims()
        return ({0: d["T"]}, {0: d["T"]}, {0: d["S"] + 1}, {0: d["S"]}, {0: d["N"]})
