"""The prefill_only runtime: the packing buffers and the score graph (AOT-compiled or eager).

Everything sized here comes from the PrefillPlan (the declared bounds and the batch token
budget) and is allocated at `start`; a call only fills a prefix of the buffers. A batch's
metadata and label ids reach the device in the staging buffer's non-blocking copy; the
only wait for the device is where the label logits are read.
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
from engines.bounded.model.families import read_model_config
from engines.bounded.runtime.compiled import CompiledRuntime, Graph, threads_for, unfrozen_for_prefill

PROGRAM = "score_prefill"  # the package name (runtime.export)


class PrefillRuntime(CompiledRuntime):
    def __init__(self, model_dir: Path, policy: PrecisionPolicy, device: str, plan: PrefillPlan,
                 compile_mode: str = "aot", log: Callable[[str], None] = print, attention: str = "auto",
                 kernel_profile: bool = False):
        super().__init__(model_dir, policy, device, compile_mode, log, attention, max_len=plan.max_len,
                         kernel_profile=kernel_profile)
        self.plan = plan
        if unfrozen_for_prefill(self.device, policy, read_model_config(self.model_dir).hidden):
            self.inductor = {**self.inductor, "freezing": False}
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
        self.buffers = PackBuffers(p.max_tokens, p.max_seqs, p.max_len, self.device, extra=p.max_labels)
        self._graph = graphs[PROGRAM]
        self._token_flops = read_model_config(self.model_dir).token_flops

    def _program(self) -> ScorePrefill:
        return ScorePrefill(self.model(), self.attention).eval()

    # --- serve --------------------------------------------------------------------------

    def pack(self, seqs: Sequence[Sequence[int]], label_ids: Sequence[int],
             prefix: Optional[Sequence[int]] = None) -> tuple[PackedBatch, Tensor]:
        """-> the batch's metadata and its label ids [N], on the device. prefix[i]: -1, or the
        query sequence i continues (buffers.PackBuffers.pack)."""
        packed = self.buffers.pack(seqs, prefix)
        return packed, self.buffers.staging.put(label_ids)

    def run(self, batch: PackedBatch, label_ids: Tensor) -> Tensor:
        """-> label logits [S, N] float32 on the CPU (the one wait for the device)."""
        with torch.inference_mode(), threads_for(self.device, batch.num_tokens * self._token_flops):
            out = self._graph(*batch.varlen_args(), batch.prefix, label_ids)
        return out.float().cpu()
