"""The prefill_only runtime: the packing buffers and the score graph (AOT-compiled or eager).

Everything sized here comes from the PrefillPlan (the declared bounds and the batch token
budget) and is allocated at `start`; a call only fills a prefix of the buffers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.plan import PrefillPlan
from engines.bounded.programs.prefill import ScorePrefill
from engines.bounded.runtime import export
from engines.bounded.runtime.buffers import PackBuffers, PackedBatch
from engines.bounded.runtime.compiled import CompiledRuntime, Graph

PROGRAM = "score_prefill"  # the package name (runtime.export)


class PrefillRuntime(CompiledRuntime):
    def __init__(self, model_dir: Path, policy: PrecisionPolicy, device: str, plan: PrefillPlan,
                 compile_mode: str = "aot", log: Callable[[str], None] = print):
        super().__init__(model_dir, policy, device, compile_mode, log)
        self.plan = plan
        self.buffers: Optional[PackBuffers] = None
        self._graph: Optional[Graph] = None

    # --- build --------------------------------------------------------------------------

    def max_positions(self) -> int:
        return self.plan.max_len

    def exports(self) -> list[export.Export]:
        return [export.score_prefill(self.plan, self._program, self.device)]

    def eager_graphs(self) -> dict[str, Graph]:
        return {PROGRAM: self._program()}

    def serve(self, graphs: dict[str, Graph], compiled: bool) -> None:
        p = self.plan
        self.buffers = PackBuffers(p.max_tokens, p.max_seqs, p.max_len, self.device)
        self._graph = graphs[PROGRAM]

    def _program(self) -> ScorePrefill:
        return ScorePrefill(self.model()).eval()

    # --- serve --------------------------------------------------------------------------

    def pack(self, seqs: Sequence[Sequence[int]]) -> PackedBatch:
        return self.buffers.pack(seqs)

    def run(self, batch: PackedBatch, label_ids: Tensor) -> Tensor:
        """-> label logits [S, N] float32 on the CPU."""
        labels = label_ids.to(self.device)
        with torch.inference_mode():
            out = self._graph(*batch.varlen_args(), labels)
        return out.float().cpu()
