"""Beam-search kernels: shared-prefix decode attention and top-W selection.

Pure functions over tensors, like kernels.py. Shapes: R requests in a decode batch, W beam
rows per request (the width bucket), B = R * W rows, P prompt positions (padded to the
batch's longest prompt), S suffix slots, H heads (Hkv K/V heads, g = H // Hkv), D head dim,
V vocabulary.

Attention of a beam's new token = one softmax over [its request's prompt keys, its own
suffix keys]. The prompt part is one batched matmul of all W beams' queries against the
request's single prompt K/V (no per-beam copy); the suffix part is per beam; the two are
merged by log-sum-exp. Attention runs in float32 (the K/V buffers are float32).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor


def key_bias(valid: Tensor) -> Tensor:
    """bool -> additive float32 bias: 0 where valid, -inf elsewhere."""
    zero = torch.zeros((), dtype=torch.float32, device=valid.device)
    return torch.where(valid, zero, torch.full_like(zero, -math.inf))


def _partial_softmax(scores: Tensor, v_matmul) -> tuple[Tensor, Tensor, Tensor]:
    # scores: [..., N] -> (unnormalised output, row max [..., 1], row sum [..., 1])
    m = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - m)
    return v_matmul(e), m, e.sum(-1, keepdim=True)


def shared_prefix_attention(q: Tensor, prompt_k: Tensor, prompt_v: Tensor, prompt_bias: Tensor,
                            suffix_k: Tensor, suffix_v: Tensor, suffix_bias: Tensor) -> Tensor:
    """q: [R, W, H, D]; prompt_k/v: [R, Hkv, P, D] float32; prompt_bias: [R, 1, 1, P];
    suffix_k/v: [B, S, Hkv, D] float32 (the new token's own K/V included); suffix_bias:
    [B, 1, 1, S] or broadcastable. Returns [B, H*D] in q's dtype."""
    r, w, h, d = q.shape
    hkv = prompt_k.shape[1]
    g = h // hkv
    scale = 1.0 / math.sqrt(d)
    qf = q.float() * scale
    # prompt part: per request and K/V head, all W*g queries in one matmul against its P keys
    qp = qf.reshape(r, w, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(r, hkv, w * g, d)
    sp = torch.matmul(qp, prompt_k.transpose(-1, -2)) + prompt_bias  # [R, Hkv, W*g, P]
    op, mp, lp = _partial_softmax(sp, lambda e: torch.matmul(e, prompt_v))  # [R, Hkv, W*g, D|1]
    op, mp, lp = (t.reshape(r, hkv, w, g, -1).permute(0, 2, 1, 3, 4).reshape(r * w, hkv, g, -1)
                  for t in (op, mp, lp))  # -> [B, Hkv, g, D|1]
    # suffix part: each beam against its own S slots
    qs = qf.reshape(r * w, hkv, g, d)
    ss = torch.matmul(qs, suffix_k.permute(0, 2, 3, 1)) + suffix_bias  # [B, Hkv, g, S]
    os_, ms, ls = _partial_softmax(ss, lambda e: torch.matmul(e, suffix_v.transpose(1, 2)))
    # log-sum-exp merge of the two partial softmaxes
    m = torch.maximum(mp, ms)
    ap, as_ = torch.exp(mp - m), torch.exp(ms - m)
    out = (op * ap + os_ * as_) / (lp * ap + ls * as_)  # [B, Hkv, g, D]
    return out.reshape(r * w, h * d).to(q.dtype)


def prepack_head(weight: Tensor, rows: int) -> Optional[Tensor]:
    """The head weight [V, hidden] prepacked for oneDNN, where that is the faster GEMM: a
    CPU, bfloat16. Measured here (2 cores, AVX-512 bf16): 66 ms vs 79 ms for aten's mm at
    100 rows, but 295 vs 271 ms at 400 rows, so `head_logits` uses it up to PACKED_MAX_ROWS."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


PACKED_MAX_ROWS = 200


def head_logits(hidden: Tensor, weight: Tensor, out: Tensor, packed: Optional[Tensor] = None) -> Tensor:
    """hidden [B, hidden] -> full-vocabulary logits [B, V] in the weight's dtype: into `out`,
    or (prepacked weight, few rows) a new tensor."""
    if packed is not None and hidden.shape[0] <= PACKED_MAX_ROWS:
        return torch.ops.mkldnn._linear_pointwise(hidden, packed, None, "none", [], "")
    return torch.mm(hidden, weight.t(), out=out)


def head_log_probs(hidden: Tensor, weight: Tensor, banned: Tensor, logp: Tensor,
                   logits: Optional[Tensor] = None, packed: Optional[Tensor] = None) -> Tensor:
    """Full-vocabulary log-probabilities into planned buffers, as transformers computes them.

    hidden: [B, hidden] final-normed; weight: [V, hidden] head; banned: [E] ids (EOS) set
    to -inf after the log-softmax, without renormalising; logp: [B, V] float32 output
    buffer; logits: [B, V] buffer in the weight's dtype when that is not float32 (the GEMM
    writes there, then the values are widened into `logp`). The log-softmax is aten's, in
    place, so float32 results match transformers' `log_softmax(logits.float())` bit for bit.
    """
    if weight.dtype == torch.float32:
        head_logits(hidden, weight, logp)
    else:
        logp.copy_(head_logits(hidden, weight, logits, packed))
    torch.ops.aten._log_softmax.out(logp, -1, False, out=logp)
    return logp.index_fill_(-1, banned, -math.inf)


def top_continuations(logp: Tensor, cum: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Unconstrained beam step for R requests at once, exact top-k without sorting W*V values.

    logp: [R, W, V] float32 log-probabilities of each beam's next token (banned at -inf);
    cum: [R, W] cumulative log-probability of each beam (-inf for a dead or padding row).
    Returns the best k of the W*V continuations cum[b] + logp[b, t] per request, best first:
    scores [R, k], parent beam [R, k], token [R, k]; a score of -inf marks a dead beam.

    Two stages: the maximum of each block of `blk` consecutive tokens, the top blocks by
    cum + block maximum, then the top k among those blocks' tokens. The k best blocks hold
    the k best continuations (float addition is monotone, so cum + max(block) is exactly the
    block's best score), and only k * blk values are sorted instead of W * V.
    """
    r, w, v = logp.shape
    blk = math.gcd(v, 64)
    nb = v // blk
    nblocks = min(w * nb, k)
    block_max = logp.view(r, w, nb, blk).amax(-1) + cum[:, :, None]  # [R, W, V/blk]
    _, top_blocks = torch.topk(block_max.view(r, w * nb), nblocks, dim=-1)  # [R, nblocks]: b * nb + c
    flat = (top_blocks * blk)[:, :, None] + torch.arange(blk, device=logp.device)  # [R, nblocks, blk]
    parent_cum = cum.gather(1, top_blocks // nb)[:, :, None]  # [R, nblocks, 1]
    cand = parent_cum + logp.view(r, w * v).gather(1, flat.view(r, -1)).view(r, nblocks, blk)
    scores, pick = torch.topk(cand.view(r, -1), min(k, nblocks * blk), dim=-1)
    index = flat.view(r, -1).gather(1, pick)  # b * V + t
    return scores, index // v, index % v
