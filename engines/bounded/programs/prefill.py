"""The prefill_only program: packed prefill, then the label rows of the head at each
sequence's last token."""
from __future__ import annotations

from torch import Tensor, nn

from engines.bounded.kernels.attention import varlen_attention
from engines.bounded.model.decoder import DecoderModel


class ScorePrefill(nn.Module):
    """forward(tokens [T], positions [T], cu_seqlens [S+1] (host), last_index [S],
    label_ids [N]) -> label logits [S, N] float32. The softmax is left to the caller, which
    may batch requests with different labels (N = their union). Attention is the opaque
    `bounded::varlen_attention` op; everything else compiles.
    """

    def __init__(self, model: DecoderModel):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, positions: Tensor, cu_seqlens: Tensor, last_index: Tensor,
                label_ids: Tensor) -> Tensor:
        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return varlen_attention(q, k, v, cu_seqlens)

        hidden, _ = self.model(tokens, positions, attend, rows=last_index)  # [S, hidden]
        return self.model.label_logits(hidden, label_ids)  # [S, N] float32
