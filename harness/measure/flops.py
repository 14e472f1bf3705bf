"""Effective FLOPs of a request, computed from the model config and the request's valid
tokens, the same way for every engine (DESIGN.md 6.4):

- 2 x non-embedding parameters per valid token the model must process;
- attention 4 x layers x heads x head_dim x context per token (a prefill token at position
  i, 1-based, attends to i tokens; a decode token at step k to prompt + k tokens);
- LM head 2 x hidden x vocab at each position whose next-token distribution the task reads:
  the last token of each sample, and each beam at each decode step.

A query + items request counts each sample as its whole concatenation query + item_i, the
work an engine scoring the samples one by one does: an engine that computes the query's
K/V once per request does less, and so reads a higher effective MFU (the harness passes the
concatenation lengths as the samples' tokens).

Beam search with S generated tokens runs S - 1 decode passes of W beams (the first token
comes from the prompt's last position). Padding, recomputation and wasted beams never count.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

FORMULA = ("effective FLOPs = sum over valid tokens of [2*N_nonemb + 4*L*H*D*context] "
           "+ 2*hidden*vocab per read position (sample last token; beam x decode step); "
           "MFU = effective FLOPs / (window_s * peak FLOP/s). A query + items request counts each "
           "sample as its full concatenation query + item_i (the work a per-sample engine does), "
           "so an engine that computes the query once reads a higher effective MFU")


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qkv_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelShape":
        heads = cfg["num_attention_heads"]
        mt = cfg.get("model_type", "")
        return cls(
            layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
            kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
            qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias")),
            qk_norm=mt == "qwen3",
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelShape":
        return cls.from_config(json.loads((Path(model_dir) / "config.json").read_text()))

    @property
    def non_embedding_params(self) -> int:
        h, d = self.hidden, self.head_dim
        q, kv = self.heads * d, self.kv_heads * d
        attn = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.qk_norm:
            attn += 2 * d
        per_layer = attn + 3 * h * self.intermediate + 2 * h
        return self.layers * per_layer + h  # + final norm

    @property
    def flops_per_token(self) -> int:
        return 2 * self.non_embedding_params

    @property
    def attn_flops_per_context(self) -> int:
        return 4 * self.layers * self.heads * self.head_dim

    @property
    def head_flops(self) -> int:
        return 2 * self.hidden * self.vocab


def prefill_flops(shape: ModelShape, n: int) -> int:
    """One sequence of n tokens, causal, head read at its last position."""
    return n * shape.flops_per_token + shape.attn_flops_per_context * n * (n + 1) // 2 + shape.head_flops


def beam_flops(shape: ModelShape, prompt: int, width: int, steps: int) -> int:
    decode_ctx = sum(prompt + k for k in range(1, steps))  # per beam
    decode = width * ((steps - 1) * (shape.flops_per_token + shape.head_flops)
                      + shape.attn_flops_per_context * decode_ctx)
    return prefill_flops(shape, prompt) + decode


def request_flops(shape: ModelShape, prompt_tokens: Sequence[int], beam_width: int = 0,
                  decode_steps: int = 0) -> int:
    if beam_width:
        return beam_flops(shape, prompt_tokens[0], beam_width, decode_steps)
    return sum(prefill_flops(shape, n) for n in prompt_tokens)


def model_shape(model: str) -> ModelShape:
    if Path(model).is_dir():
        return ModelShape.from_dir(model)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model)
    except OSError as e:  # not cached and the hub out of reach (or no such model): say which field
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"field model: {model!r} is a hub id this machine cannot load ({reason}); "
                         f"use a preset or a local model directory") from None
    return ModelShape.from_config(config.to_dict())
