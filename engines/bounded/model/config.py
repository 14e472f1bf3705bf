"""The architecture of a decoder, read from an HF `config.json` by a family builder
(families.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    tied_head: bool
    qkv_bias: bool
    qk_norm: bool

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def token_flops(self) -> int:
        """GEMM FLOPs of the layers per token (2 x the non-embedding weights)."""
        per_layer = self.hidden * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden \
            + 3 * self.hidden * self.intermediate
        return 2 * self.layers * per_layer
