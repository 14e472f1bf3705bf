"""The Qwen2/Qwen3 decoder, assembled from layers.py; no kernels and no compiler here.

Two kinds of entry points:
- packed prefill: `DecoderModel.prefill(tokens [T], positions [T], attend)` runs all valid
  tokens of all sequences as one [T, hidden] tensor; `attend` is the attention closure that
  knows the packing (kernels.packed_attention_*). It can keep each layer's K/V.
- pieces for a decode step: `DecoderLayer.project_qkv` (norm, fused QKV GEMM, q/k norm,
  rope) and `DecoderLayer.finish` (O GEMM, residual, MLP) around any attention, plus
  `DecoderModel.embed / rope / norm / head_logits`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from engines.bounded import kernels
from engines.bounded.config import ModelConfig, PrecisionPolicy
from engines.bounded.families import read_model_config
from engines.bounded.layers import Linear, RMSNorm, Rope
from engines.bounded.weights import ModelDirError, WeightReader

KV = tuple[Tensor, Tensor]  # k, v: [T, Hkv, D] each, after k-norm and rope


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, w: WeightReader, i: int, policy: PrecisionPolicy):
        super().__init__()
        self.cfg = cfg
        p = f"model.layers.{i}."
        a = p + "self_attn."
        self.input_norm = RMSNorm(w.get(p + "input_layernorm.weight"), cfg.rms_eps)
        self.post_norm = RMSNorm(w.get(p + "post_attention_layernorm.weight"), cfg.rms_eps)
        qkv_w = torch.cat([w.get(a + f"{n}_proj.weight") for n in "qkv"])  # [Q+2KV, hidden]
        qkv_b = None
        if cfg.qkv_bias:
            qkv_b = torch.cat([w.get(a + f"{n}_proj.bias") for n in "qkv"])
        self.qkv = Linear.for_group("qkv", qkv_w, qkv_b, policy)
        o_b = w.get(a + "o_proj.bias") if a + "o_proj.bias" in w else None
        self.o = Linear.for_group("o", w.get(a + "o_proj.weight"), o_b, policy)
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(w.get(a + "q_norm.weight"), cfg.rms_eps)
            self.k_norm = RMSNorm(w.get(a + "k_norm.weight"), cfg.rms_eps)
        m = p + "mlp."
        gate_up = torch.cat([w.get(m + "gate_proj.weight"), w.get(m + "up_proj.weight")])  # [2I, hidden]
        self.gate_up = Linear.for_group("gate_up", gate_up, None, policy)
        self.down = Linear.for_group("down", w.get(m + "down_proj.weight"), None, policy)

    def project_qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x: [T, hidden] residual stream -> q [T, Hq, D], k/v [T, Hkv, D]
        c = self.cfg
        qkv = self.qkv(self.input_norm(x))
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.reshape(-1, c.heads, c.head_dim)
        k = k.reshape(-1, c.kv_heads, c.head_dim)
        v = v.reshape(-1, c.kv_heads, c.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return kernels.apply_rope(q, cos, sin), kernels.apply_rope(k, cos, sin), v

    def finish(self, x: Tensor, attn: Tensor) -> Tensor:
        # x: [T, hidden] residual stream, attn: [T, Hq*D] -> next residual stream [T, hidden]
        x = x + self.o(attn)  # (x may be a float32 residual stream: see PrecisionPolicy)
        return x + self.down(kernels.swiglu(self.gate_up(self.post_norm(x))))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: kernels.Attend) -> tuple[Tensor, KV]:
        q, k, v = self.project_qkv(x, cos, sin)
        return self.finish(x, attend(q, k, v)), (k, v)


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, w: WeightReader, policy: PrecisionPolicy,
                 max_positions: Optional[int] = None):
        super().__init__()
        self.cfg, self.policy = cfg, policy
        self.register_buffer("embed_weight", w.get("model.embed_tokens.weight"))  # [vocab, hidden]
        self.tied_head = cfg.tied_head
        if not cfg.tied_head:
            if "lm_head.weight" not in w:
                raise ModelDirError("untied model (tie_word_embeddings false) without lm_head.weight")
            self.register_buffer("head_weight", w.get("lm_head.weight"))  # [vocab, hidden]
        self.layers = nn.ModuleList(DecoderLayer(cfg, w, i, policy) for i in range(cfg.layers))
        self.norm = RMSNorm(w.get("model.norm.weight"), cfg.rms_eps)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, max_positions or cfg.max_positions,
                         policy.torch_dtype, w.device)

    def embed(self, tokens: Tensor) -> Tensor:
        # -> [T, hidden] residual stream in the policy's residual dtype
        return self.embed_weight[tokens].to(self.policy.residual_torch_dtype)

    def prefill(self, tokens: Tensor, positions: Tensor, attend: kernels.Attend,
                rows: Optional[Tensor] = None, keep_kv: bool = False) -> tuple[Tensor, list[KV]]:
        """tokens/positions: [T] -> final-normed hidden states of `rows` ([R] packed indices;
        all T when None) as [R, hidden], and each layer's K/V when `keep_kv`."""
        cos, sin = self.rope(positions)
        x = self.embed(tokens)
        kv: list[KV] = []
        for layer in self.layers:
            x, layer_kv = layer(x, cos, sin, attend)
            if keep_kv:
                kv.append(layer_kv)
        if rows is not None:
            x = x[rows]
        return self.norm(x), kv

    def head_logits(self, hidden: Tensor, token_ids: Tensor) -> Tensor:
        """Logits of only the given vocabulary rows: hidden [S, hidden], ids [N] -> [S, N] float32."""
        weight = self.embed_weight if self.tied_head else self.head_weight
        rows = weight[token_ids]  # [N, hidden]
        return hidden.float() @ rows.float().t()


def load_model(model_dir: Path, policy: PrecisionPolicy, device: str | torch.device = "cpu",
               max_positions: Optional[int] = None) -> DecoderModel:
    """Build the decoder for `model_dir` (its family from config.json) with weights in the
    policy's dtype on `device`. `max_positions` sizes the rotary tables (default: config)."""
    cfg = read_model_config(model_dir)
    reader = WeightReader(Path(model_dir), policy.torch_dtype, torch.device(device))
    model = DecoderModel(cfg, reader, policy, max_positions)
    return model.eval()
