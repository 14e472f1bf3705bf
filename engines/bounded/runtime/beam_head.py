"""The full-vocabulary head of a beam step, on the planned buffers: the GEMM (prepacked for
oneDNN, or int8) and its tail -- float32 log-probabilities, or on a CPU in a low-precision
float plan the logits' summary (kernels/head.logit_summary, compiled as the
`beam_head_tail` package), which the choice of beams reads instead (kernels/select.py).

In a bf16 plan with the native kernels loaded (kernels/native.py) the head is fused: it
returns the hidden rows (HiddenRows) and the choice of beams runs the GEMM, log-softmax and
top-k as one pass over the weight (csrc/beam_head.cpp), no [rows, V] logits written; a
choice that needs logits (an item trie) gets them from the same kernel, value for value.
A float32 plan on a CPU with AVX2 + FMA fuses the same way (csrc/beam_head_f32.cpp): its
common choice scores cum + (logit - lse) from its own GEMM, equal to transformers' to
float32 rounding (not bit for bit); a choice that needs logits takes the exact float32
log-probabilities as before.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from engines.bounded.kernels import head, native
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.programs.beam import BeamHeadTail
from engines.bounded.runtime.buffers import BeamBuffers
from engines.bounded.runtime.compiled import threads_for
from engines.bounded.runtime.spans import span

TAIL = "beam_head_tail"  # the package name (runtime.export)


def summarised(device: torch.device, policy: PrecisionPolicy, banned: int) -> bool:
    """Does the head's tail summarise the logits instead of writing float32 log-probabilities?
    On a CPU in a low-precision float plan: a float32 plan keeps transformers' log-softmax bit
    for bit, the int8 head writes float32 anyway, and a GPU's decode steps are captured with
    the log-probabilities."""
    return (device.type == "cpu" and policy.dtype in ("bfloat16", "float16")
            and policy.gemm_kind("head") != "int8" and banned > 0)


def fuses(weight: Tensor) -> bool:
    """Can the native fused head serve this head weight [V, hidden]? On a CPU: bf16 with the
    native kernels loaded and an even hidden size, or float32 with the float32 library loaded
    (the runtime loads the library of the plan's dtype)."""
    if weight.device.type != "cpu":
        return False
    if weight.dtype == torch.float32:
        return native.F32.available()
    return weight.dtype == torch.bfloat16 and native.available() and weight.shape[1] % 2 == 0


def tail_program(vocab: int) -> BeamHeadTail:
    return BeamHeadTail(head.block_size(vocab)).eval()


class BeamHead:
    def __init__(self, weight: Tensor, banned: Tensor, buffers: BeamBuffers, policy: PrecisionPolicy,
                 rows: int, tail: Optional[Any], fuse: bool = True):
        """weight [V, hidden]; banned [E] ids; `rows`: the GEMM's planned rows (the oneDNN
        prepacking hint); `tail`: the compiled (or eager) BeamHeadTail, None for the float32
        log-probabilities; `fuse`: False keeps the head's output a tensor (a captured step)."""
        self.weight, self.banned, self.buffers, self.tail = weight, banned, buffers, tail
        self.vocab = weight.shape[0]
        self.int8 = head.Int8Head.of(weight) if policy.gemm_kind("head") == "int8" else None
        self.f32 = weight.dtype == torch.float32
        self.fused = fuse and (tail is not None or (self.f32 and self.int8 is None)) and fuses(weight)
        self.native = None
        if self.fused:
            ops = torch.ops.bounded_native_f32 if self.f32 else torch.ops.bounded_native
            self.native = (ops.pack_head_f32 if self.f32 else ops.pack_head_bf16)(weight)
        self.packed = None if self.fused else head.prepack_head(weight, rows)

    def __call__(self, hidden: Tensor) -> Tensor | head.LogitRows | head.HiddenRows:
        """hidden [rows, hidden] -> log-probabilities [rows, V] in the planned buffer, or the
        logits and their summary (LogitRows [rows, 1, ...]), or (fused) the rows themselves."""
        if self.fused:
            return head.HiddenRows(hidden[:, None], self.vocab, self)
        with span("bounded::head"), self._threads(hidden):
            return self._rows(hidden)

    def _threads(self, hidden: Tensor):
        return threads_for(hidden.device, 2 * hidden.numel() * self.vocab, self.weight.nbytes)  # the weight streams

    def top(self, hidden: Tensor, cum: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
        """The fused head and choice: hidden [R * W, hidden], cum [R, W] -> each request's
        best k continuations: scores, parent rows, tokens [R, k] (select.top_continuations)."""
        with span("bounded::head"), self._threads(hidden):
            return native.beam_head_top(hidden.contiguous(), self.native, self.vocab, self.banned,
                                        cum.float().contiguous(), k)

    def logit_rows(self, hidden: Tensor) -> head.LogitRows | Tensor:
        """The fused head's logits and their summary, for a choice that reads logits (float32:
        the exact log-probabilities [rows, V])."""
        with span("bounded::head"), self._threads(hidden):
            if self.f32:
                return self._rows(hidden)
            x = torch.ops.bounded_native.head_logits_bf16(hidden.contiguous(), self.native, self.vocab)
            lse, block_max = self.tail(x, head.ban_logits(x, self.banned))
            return head.LogitRows(x[:, None], lse[:, None], block_max[:, None], head.block_size(self.vocab))

    def _rows(self, hidden: Tensor) -> Tensor | head.LogitRows:
        logp, logits = self.buffers.head_views(hidden.shape[0])
        if self.tail is not None:
            x = head.head_logits(hidden, self.weight, logits, self.packed)  # [rows, V]
            lse, block_max = self.tail(x, head.ban_logits(x, self.banned))
            return head.LogitRows(x[:, None], lse[:, None], block_max[:, None], head.block_size(x.shape[1]))
        if self.int8 is not None:
            return head.log_probs_of(self.int8(hidden, logp), self.banned, logp)  # in place
        return head.head_log_probs(hidden, self.weight, self.banned, logp, logits, self.packed)


def view(out: Tensor | head.LogitRows | head.HiddenRows, r: int, w: int) -> Tensor | head.LogitRows | head.HiddenRows:
    """A head's output for rows [r * w] as [r, w, ...]."""
    return out.view(r, w, -1) if isinstance(out, Tensor) else out.view(r, w)
