"""Graph entry points: nn.Modules whose forward takes only tensors, so that the runtime can
run them eagerly or export and compile them ahead of time. They assemble model calls and
kernels; they hold no request logic.
"""
from __future__ import annotations

from torch import Tensor, nn

from engines.bounded import kernels
from engines.bounded.model import DecoderModel


class ScorePrefill(nn.Module):
    """Packed prefill + the label rows of the head at each sequence's last token.

    forward(tokens [T], positions [T], cu_seqlens [S+1] (host), last_index [S],
    label_ids [N]) -> label logits [S, N] float32. The softmax is left to the caller, which
    may batch requests with different labels (N = their union). Attention is the opaque
    `bounded::varlen_attention` op; everything else compiles.
    """

    def __init__(self, model: DecoderModel):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, positions: Tensor, cu_seqlens: Tensor, last_index: Tensor,
                label_ids: Tensor) -> Tensor:
        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return kernels.varlen_attention(q, k, v, cu_seqlens)

        hidden, _ = self.model.prefill(tokens, positions, attend, rows=last_index)  # [S, hidden]
        return self.model.head_logits(hidden, label_ids)  # [S, N] float32
