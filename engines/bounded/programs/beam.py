"""The beam_search programs: the prompt prefill that keeps K/V, and the transformer body of
one decode step of all beams of a batch of requests.

Both stop at the final-normed hidden states; the full-vocabulary head GEMM and the choice
of the next beams run in the runtime on planned buffers (kernels.head, kernels.select).
K/V leave the graphs in float32, the dtype of the beam K/V buffers. A third program,
`BeamHeadTail`, is the head's tail on a CPU in low precision: one compiled pass over the
logits for each row's log-sum-exp and block maxima (kernels.head.logit_summary).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from engines.bounded.kernels.attention import packed_attention
from engines.bounded.kernels.beam_attention import key_bias, shared_prefix_attention
from engines.bounded.kernels.head import logit_summary
from engines.bounded.model.decoder import DecoderModel


class BeamPrefill(nn.Module):
    """Packed prefill of R prompts, keeping every layer's K/V.

    forward(tokens [T], positions [T], cu_seqlens [R+1], pad_index [R, L], unpad_index [T],
    last_index [R]) (PackedBatch.varlen_args) -> (final-normed hidden state at each prompt's
    last token [R, hidden], prompt_k [layers, R, Hkv, L, D] float32, prompt_v likewise; rows
    past a prompt's end hold copies of its last token and must be masked by the reader).
    Attention as in programs/prefill.py; `pad_index` also lays out the K/V.
    """

    def __init__(self, model: DecoderModel, attention: str = "per_sequence"):
        super().__init__()
        self.model, self.attention = model, attention

    def forward(self, tokens: Tensor, positions: Tensor, cu_seqlens: Tensor, pad_index: Tensor,
                unpad_index: Tensor, last_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attend_packed = packed_attention(self.attention, cu_seqlens, pad_index, unpad_index)

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return attend_packed(q, k, v)

        hidden, kv = self.model(tokens, positions, attend, rows=last_index, keep_kv=True)
        # [layers, T, Hkv, D] -> padded per prompt [layers, R, Hkv, L, D]
        k = torch.stack([k for k, _ in kv])[:, pad_index].permute(0, 1, 3, 2, 4).float()
        v = torch.stack([v for _, v in kv])[:, pad_index].permute(0, 1, 3, 2, 4).float()
        return hidden, k.contiguous(), v.contiguous()


STEP_ATTENTIONS = ("native", "python")


class BeamDecodeStep(nn.Module):
    """The transformer body of one decode step of B = R * W beam rows (W rows per request,
    grouped by request).

    forward(tokens [B], positions [B], prompt_k/v [layers, R, Hkv, P, D], prompt_len [R],
    suffix_k/v [layers, B, S, Hkv, D], suffix_len [] (valid slots, the same for all rows))
    -> (final-normed hidden states [B, hidden], new_k/new_v [layers, B, Hkv, D] float32: the
    K/V of `tokens`, for the runtime to store in slot `suffix_len`).

    `attention`: "native", the float32 AVX2 kernel (kernels/native.py: `beam_attention_f32`,
    one op per layer, the new K/V read where they lie), or "python"
    (kernels/beam_attention.shared_prefix_attention, any device).
    """

    def __init__(self, model: DecoderModel, attention: str = "python"):
        super().__init__()
        if attention not in STEP_ATTENTIONS:
            raise ValueError(f"beam step attention {attention!r}; choose one of {', '.join(STEP_ATTENTIONS)}")
        self.model, self.attention = model, attention

    def forward(self, tokens: Tensor, positions: Tensor, prompt_k: Tensor, prompt_v: Tensor,
                prompt_len: Tensor, suffix_k: Tensor, suffix_v: Tensor,
                suffix_len: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r, b, s, p = prompt_k.shape[1], tokens.shape[0], suffix_k.shape[2], prompt_k.shape[3]
        w = b // r
        if self.attention == "native":
            def attend_native(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                out = torch.ops.bounded_native_f32.beam_attention_f32(
                    q.float(), k.float(), v.float(), prompt_k[layer], prompt_v[layer], prompt_len,
                    suffix_k[layer], suffix_v[layer], suffix_len)
                return out.to(q.dtype)

            hidden, kv = self.model(tokens, positions, attend_native, keep_kv=True)
            return hidden, torch.stack([k.float() for k, _ in kv]), torch.stack([v.float() for _, v in kv])
        prompt_bias = key_bias(torch.arange(p, device=tokens.device)[None, :] < prompt_len[:, None])
        prompt_bias = prompt_bias[:, None, None, :]  # [R, 1, 1, P]
        slots = torch.arange(s + 1, device=tokens.device)
        suffix_bias = key_bias((slots < suffix_len) | (slots == s))  # [S+1]: valid + own slot

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            # q [B, H, D], k/v [B, Hkv, D]: the new token's own K/V joins its beam's suffix
            sk = torch.cat([suffix_k[layer], k.float()[:, None]], dim=1)  # [B, S+1, Hkv, D]
            sv = torch.cat([suffix_v[layer], v.float()[:, None]], dim=1)
            return shared_prefix_attention(q.reshape(r, w, *q.shape[1:]), prompt_k[layer], prompt_v[layer],
                                           prompt_bias, sk, sv, suffix_bias)

        hidden, kv = self.model(tokens, positions, attend, keep_kv=True)
        return hidden, torch.stack([k.float() for k, _ in kv]), torch.stack([v.float() for _, v in kv])


class BeamHeadTail(nn.Module):
    """forward(logits [B, V] (banned ids at -inf), banned [B, E] float32 (their former
    logits)) -> (lse [B], block_max [B, V/blk]) float32 (kernels.head.logit_summary: no
    weights; compiled, the reductions fuse)."""

    def __init__(self, blk: int):
        super().__init__()
        self.blk = blk

    def forward(self, logits: Tensor, banned: Tensor) -> tuple[Tensor, Tensor]:
        return logit_summary(logits, banned, self.blk)
