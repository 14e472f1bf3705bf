"""Shared-prefix attention of a beam decode step.

Shapes: R requests in a decode batch, W beam rows per request (the width bucket), B = R * W
rows, P prompt positions (padded to the batch's longest prompt), S suffix slots, H heads
(Hkv K/V heads, g = H // Hkv), D head dim.

Attention of a beam's new token = one softmax over [its request's prompt keys, its own
suffix keys]. The prompt part is one batched matmul of all W beams' queries against the
request's single prompt K/V (no per-beam copy); the suffix part is per beam; the two are
merged by log-sum-exp (partial.py). Attention runs in float32 (the K/V buffers are float32).
On a CPU the native kernel (`step_attention_for`) computes the same in one call a layer.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from engines.bounded.kernels import native
from engines.bounded.kernels.partial import merge_partials, partial_softmax


def step_attention_for(device: torch.device, log: Callable[[str], None] = print) -> str:
    """A decode step's attention on `device` (programs/beam.STEP_ATTENTIONS): on a CPU with
    AVX2 + FMA the native float32 kernel (csrc/beam_attention_f32.cpp; built on first use),
    in bf16 plans too, since the K/V buffers are float32; the Python one elsewhere."""
    return "native" if torch.device(device).type == "cpu" and native.F32.load(log) else "python"


def key_bias(valid: Tensor) -> Tensor:
    """bool -> additive float32 bias: 0 where valid, -inf elsewhere."""
    zero = torch.zeros((), dtype=torch.float32, device=valid.device)
    return torch.where(valid, zero, torch.full_like(zero, -math.inf))


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
    op, mp, lp = partial_softmax(sp, lambda e: torch.matmul(e, prompt_v))  # [R, Hkv, W*g, D|1]
    op, mp, lp = (t.reshape(r, hkv, w, g, -1).permute(0, 2, 1, 3, 4).reshape(r * w, hkv, g, -1)
                  for t in (op, mp, lp))  # -> [B, Hkv, g, D|1]
    # suffix part: each beam against its own S slots (S <= 6), as broadcast products and sums
    # rather than B * Hkv matmuls of a few columns each: compiled, they fuse into one kernel
    qs = qf.reshape(r * w, hkv, g, 1, d)
    ss = (qs * suffix_k.permute(0, 2, 1, 3)[:, :, None]).sum(-1) + suffix_bias  # [B, Hkv, g, S]
    os_, ms, ls = partial_softmax(ss, lambda e: (e[..., None] * suffix_v.permute(0, 2, 1, 3)[:, :, None]).sum(-2))
    out = merge_partials((op, mp, lp), (os_, ms, ls))  # [B, Hkv, g, D]
    return out.reshape(r * w, h * d).to(q.dtype)
