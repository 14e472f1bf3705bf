"""The prefill_only program: packed prefill (sequences alone, or a query and its items
sharing its K/V), then the label rows of the head at each sequence's last token."""
from __future__ import annotations

from torch import Tensor, nn

from engines.bounded.kernels.attention import packed_attention
from engines.bounded.kernels.native import NativeAttention
from engines.bounded.model.decoder import DecoderModel


class ScorePrefill(nn.Module):
    """forward(tokens [T], positions [T], cu_seqlens [S+1], pad_index [S, L], unpad_index [T],
    last_index [S], prefix [S], label_ids [N]) -> label logits [S, N] float32
    (PackedBatch.varlen_args, its prefix, then the labels; all on the device). The softmax
    is left to the caller, which may batch requests with different labels (N = their
    union). `attention` (kernels/attention.py) says which metadata the graph reads:
    cu_seqlens and prefix ("per_sequence": -1, or the query whose K/V an item shares) or the
    padded-view indices ("padded"); everything else compiles. The "native" attention takes
    each layer's qkv projection whole and norms and rotates q/k itself (where it fuses: head
    dims that are multiples of 32, bf16).
    """

    def __init__(self, model: DecoderModel, attention: str = "per_sequence"):
        super().__init__()
        self.model, self.attention = model, attention

    def forward(self, tokens: Tensor, positions: Tensor, cu_seqlens: Tensor, pad_index: Tensor,
                unpad_index: Tensor, last_index: Tensor, prefix: Tensor, label_ids: Tensor) -> Tensor:
        attend_packed = packed_attention(self.attention, cu_seqlens, pad_index, unpad_index, prefix)

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return attend_packed(q, k, v)

        cfg = self.model.cfg
        fused = attend_packed.fused if isinstance(attend_packed, NativeAttention) \
            and NativeAttention.fuses(cfg.head_dim, self.model.rope.cos.dtype) else None
        hidden, _ = self.model(tokens, positions, attend, rows=last_index, fused=fused)  # [S, hidden]
        return self.model.label_logits(hidden, label_ids)  # [S, N] float32
