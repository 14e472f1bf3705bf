"""What each program is exported with: an `Export` per package -- its name, the planned sizes
it is built for (part of the cache key), its module (made only on a cache miss), an example
call and the dynamic dims.

Every example has >= 2 distinct sizes per dynamic dim, so export specialises none, and
typical ones, since Inductor tunes its kernels for the example's sizes. (A Dim needs
max > min; sizes past the plan are stopped by the buffers anyway. No dim is named "S":
derived dims go through sympy, where S is a singleton registry.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.export import Dim

from engines.bounded.model.config import ModelConfig
from engines.bounded.plan import BeamGraphPlan, BeamPlan, PrefillPlan
from engines.bounded.runtime.buffers import example_batch


@dataclass(frozen=True)
class Export:
    name: str
    shapes: Any  # a frozen dataclass of plan.py
    build: Callable[[], nn.Module]
    example: tuple
    dims: tuple


def score_prefill(plan: PrefillPlan, build: Callable[[], nn.Module], device: torch.device) -> Export:
    """programs.prefill.ScorePrefill(tokens, positions, cu_seqlens, pad_index, unpad_index,
    last_index, prefix, label_ids)."""
    n = max(2, min(plan.max_seqs, 15, plan.max_tokens // 2))
    length = _apart(n, max(2, min(plan.max_len, 96, plan.max_tokens // n)))
    b = example_batch(n, length, device)
    example = (*(t.clone() for t in b.varlen_args()), b.prefix.clone(), torch.tensor([1, 2], device=device))
    t = Dim("tokens", min=1, max=max(2, plan.max_tokens))
    s = Dim("seqs", min=1, max=max(2, plan.max_seqs))
    longest = Dim("longest", min=1, max=max(3, plan.max_len))
    labels = Dim("labels", min=1, max=max(2, plan.max_labels))
    return Export("score_prefill", plan, build, example,
                  ({0: t}, {0: t}, {0: s + 1}, {0: s, 1: longest}, {0: t}, {0: s}, {0: s}, {0: labels}))


def beam_prefill(plan: BeamPlan, build: Callable[[], nn.Module], device: torch.device) -> Export:
    """programs.beam.BeamPrefill(tokens, positions, cu_seqlens, pad_index, unpad_index,
    last_index)."""
    r = max(2, min(plan.max_requests, 4))
    b = example_batch(r, _apart(r, max(3, min(plan.max_prompt, 96))), device)
    example = tuple(t.clone() for t in b.varlen_args())
    t = Dim("tokens", min=1, max=max(2, plan.max_requests) * max(3, plan.max_prompt))
    prompts = Dim("prompts", min=1, max=max(2, plan.max_requests))
    longest = Dim("longest", min=1, max=max(3, plan.max_prompt))
    return Export("beam_prefill", plan.graph(0), build, example,
                  ({0: t}, {0: t}, {0: prompts + 1}, {0: prompts, 1: longest}, {0: t}, {0: prompts}))


def _apart(n: int, length: int) -> int:
    """An example length other than the example's sequence count n (two dynamic dims with
    equal example sizes would be unified)."""
    if length != n:
        return length
    return length - 1 if length > 2 else length + 1


def beam_step(plan: BeamPlan, width: int, cfg: ModelConfig, build: Callable[[], nn.Module],
              device: torch.device) -> Export:
    """programs.beam.BeamDecodeStep(tokens, positions, prompt_k, prompt_v, prompt_len,
    suffix_k, suffix_v, suffix_len) for the W = `width` bucket."""
    s = plan.graph(width)
    return Export(f"beam_step_w{width}", s, build, _step_example(cfg, s, device), _step_dims(s))


def _step_example(cfg: ModelConfig, s: BeamGraphPlan, device: torch.device) -> tuple[Tensor, ...]:
    r, p = 2, max(3, min(s.max_prompt, 96))  # a typical prompt length (Inductor tunes for it)
    b = r * s.width
    kv = (cfg.layers, r, cfg.kv_heads, p, cfg.head_dim)
    suffix = (cfg.layers, b, s.suffix_slots, cfg.kv_heads, cfg.head_dim)
    f32 = dict(dtype=torch.float32, device=device)
    i64 = dict(dtype=torch.int64, device=device)
    return (torch.zeros(b, **i64), torch.full((b,), p, **i64), torch.zeros(kv, **f32), torch.zeros(kv, **f32),
            torch.tensor([p, p - 2], **i64), torch.zeros(suffix, **f32), torch.zeros(suffix, **f32),
            torch.tensor(1, **i64))


def _step_dims(s: BeamGraphPlan) -> tuple:
    r = Dim("requests", min=1, max=max(2, s.max_requests))
    p = Dim("prompt", min=1, max=max(3, s.max_prompt))
    b = s.width * r
    return ({0: b}, {0: b}, {1: r, 3: p}, {1: r, 3: p}, {0: r}, {1: b}, {1: b}, None)


def beam_head_tail(plan: BeamPlan, vocab: int, banned: int, dtype: torch.dtype, build: Callable[[], nn.Module],
                   device: torch.device) -> Export:
    """programs.beam.BeamHeadTail(logits [B, V], banned [B, E]) for up to the plan's beam rows."""
    rows = max(3, plan.max_rows)
    b = min(rows - 1, 100)
    example = (torch.zeros(b, vocab, dtype=dtype, device=device), torch.zeros(b, max(1, banned), device=device))
    dim = Dim("rows", min=1, max=rows)
    return Export("beam_head_tail", plan.graph(plan.max_width), build, example, ({0: dim}, {0: dim}))
