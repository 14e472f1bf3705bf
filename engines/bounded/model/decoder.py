"""The Qwen2/Qwen3 decoder, assembled from layers.py; no kernels and no compiler here.

One forward serves every program: `DecoderModel.forward(tokens [T], positions [T], attend)`
runs the layer loop over T token rows (the packed tokens of a prefill, or the beam rows of
a decode step); `attend(layer, q, k, v)` is the program's attention, which knows how rows
relate (packed sequences, a shared prompt K/V plus each beam's suffix). It can keep every
layer's K/V for the caller.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from engines.bounded.kernels import int8
from engines.bounded.kernels.native import NativeAttention
from engines.bounded.model.config import ModelConfig
from engines.bounded.model.families import read_model_config
from engines.bounded.model.layers import Attend, FusedAttend, GatedMLP, Linear, Normed, Quantised, RMSNorm, Rope
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.model.weights import ModelDirError, WeightReader

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
        qkv_b = torch.cat([w.get(a + f"{n}_proj.bias") for n in "qkv"]) if cfg.qkv_bias else None
        self.qkv = Linear.for_group("qkv", qkv_w, qkv_b, policy)
        o_b = w.get(a + "o_proj.bias") if a + "o_proj.bias" in w else None
        self.o = Linear.for_group("o", w.get(a + "o_proj.weight"), o_b, policy)
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(w.get(a + "q_norm.weight"), cfg.rms_eps)
            self.k_norm = RMSNorm(w.get(a + "k_norm.weight"), cfg.rms_eps)
        m = p + "mlp."
        gate_up = torch.cat([w.get(m + "gate_proj.weight"), w.get(m + "up_proj.weight")])  # [2I, hidden]
        self.mlp = GatedMLP(Linear.for_group("gate_up", gate_up, None, policy),
                            Linear.for_group("down", w.get(m + "down_proj.weight"), None, policy))

    def project(self, x: Tensor) -> Tensor:
        # x: [T, hidden] residual stream -> qkv [T, (Hq + 2 Hkv) D] as the GEMM gives it
        return self.qkv(self.input_norm(x))

    def attend_normed(self, h: Normed, fused: FusedAttend, rope: Rope, positions: Tensor) -> Tensor:
        # h: the input norm's output [T, hidden] (`Quantised` where qkv `takes_quantised`) ->
        # the attention's output [T, Hq*D], q/k normed and rotated by `fused`
        c = self.cfg
        qn = None if self.q_norm is None else self.q_norm.weight
        kn = None if self.k_norm is None else self.k_norm.weight
        if isinstance(h, Quantised):
            # the int8 product goes to the kernel with its rows' scales, which it applies as it
            # reads each row (csrc/varlen_attention.cpp): no pass of its own over [T, (Hq + 2 Hkv) D]
            product = self.qkv.partial(h).product
            return fused(product, c.heads, c.kv_heads, qn, kn, c.rms_eps, rope.cos, rope.sin, positions,
                         row_scale=h.scale)
        return fused(self.qkv(h), c.heads, c.kv_heads, qn, kn, c.rms_eps, rope.cos, rope.sin, positions)

    def quantises_input(self, dtype: torch.dtype) -> bool:
        """Whether `attend_normed` takes the input norm `Quantised` (int8 qkv without bias into
        the fused attention, which scales the rows)."""
        return self.qkv.takes_quantised(dtype) and NativeAttention.scales_rows(dtype)

    def project_qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x: [T, hidden] residual stream -> q [T, Hq, D], k/v [T, Hkv, D]
        c = self.cfg
        qkv = self.project(x)
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.reshape(-1, c.heads, c.head_dim)
        k = k.reshape(-1, c.kv_heads, c.head_dim)
        v = v.reshape(-1, c.kv_heads, c.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return Rope.rotate(q, cos, sin), Rope.rotate(k, cos, sin), v

    def finish(self, x: Tensor, attn: Tensor) -> Tensor:
        # x: [T, hidden] residual stream, attn: [T, Hq*D] -> next residual stream [T, hidden]
        x = x + self.o(attn)  # (x may be a float32 residual stream: see PrecisionPolicy)
        return x + self.mlp(self.post_norm(x))


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

    @property
    def lm_head(self) -> Tensor:
        return self.embed_weight if self.tied_head else self.head_weight  # [V, hidden]

    def embed(self, tokens: Tensor) -> Tensor:
        # -> [T, hidden] residual stream in the policy's residual dtype
        return self.embed_weight[tokens].to(self.policy.residual_torch_dtype)

    def forward(self, tokens: Tensor, positions: Tensor, attend: Attend, rows: Optional[Tensor] = None,
                keep_kv: bool = False, fused: Optional[FusedAttend] = None) -> tuple[Tensor, list[KV]]:
        """tokens/positions: [T] -> final-normed hidden states of `rows` ([R] row indices; all
        T when None) as [R, hidden], and each layer's K/V when `keep_kv`. `fused`: an attention
        that norms and rotates q/k itself, used instead of `attend` (not with `keep_kv`)."""
        if fused is not None and keep_kv:
            raise ValueError("a fused attention keeps no K/V")
        x = self.embed(tokens)
        kv: list[KV] = []
        if fused is not None:  # the attention reads the rotary tables itself
            x = self._fused_layers(x, fused, positions)
        else:
            cos, sin = self.rope(positions)
            for i, layer in enumerate(self.layers):
                q, k, v = layer.project_qkv(x, cos, sin)
                x = layer.finish(x, attend(i, q, k, v))
                if keep_kv:
                    kv.append((k, v))
        if rows is not None:
            x = x[rows]
        return self.norm(x), kv

    def _fused_layers(self, x: Tensor, fused: FusedAttend, positions: Tensor) -> Tensor:
        # x: [T, hidden] residual stream -> after the last layer's residual add. Each residual
        # add goes with the norm after it, in one pass (RMSNorm.add_norm), the norm quantised
        # where the GEMM after it is int8, and an int8 GEMM's row scales applied in that pass
        layers, dtype = self.layers, self.policy.torch_dtype
        first = layers[0]
        h: Normed = first.input_norm(x)
        if first.quantises_input(dtype):
            h = Quantised(*int8.quantise_rows(h))
        for i, layer in enumerate(layers):
            attn = layer.attend_normed(h, fused, self.rope, positions)
            x, h = layer.post_norm.add_norm(x, layer.o.partial(attn), quantise=layer.mlp.takes_quantised(dtype))
            delta = layer.mlp.partial(h)
            if i + 1 == len(layers):
                return x + delta.value()
            after = layers[i + 1]
            x, h = after.input_norm.add_norm(x, delta, quantise=after.quantises_input(dtype))
        return x

    def label_logits(self, hidden: Tensor, token_ids: Tensor) -> Tensor:
        """Logits of only the given vocabulary rows: hidden [S, hidden], ids [N] -> [S, N] float32."""
        rows = self.lm_head[token_ids]  # [N, hidden]
        return hidden.float() @ rows.float().t()


def load_model(model_dir: Path, policy: PrecisionPolicy, device: str | torch.device = "cpu",
               max_positions: Optional[int] = None) -> DecoderModel:
    """Build the decoder for `model_dir` (its family from config.json) with weights in the
    policy's dtype on `device`. `max_positions` sizes the rotary tables (default: config)."""
    cfg = read_model_config(model_dir)
    reader = WeightReader(Path(model_dir), policy.torch_dtype, torch.device(device))
    model = DecoderModel(cfg, reader, policy, max_positions)
    return model.eval()
