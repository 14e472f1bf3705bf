"""Model families by HF `model_type`: each turns a config.json into a ModelConfig.

Adding a family that fits the decoder in decoder.py is one registration here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from engines.bounded.model.config import ModelConfig
from engines.bounded.model.weights import read_config_json


class UnknownModelFamily(ValueError):
    pass


class UnsupportedModelConfig(ValueError):
    pass


def _rope_theta(cfg: dict[str, Any]) -> float:
    # transformers >= 5 writes rope_parameters: {rope_theta, rope_type}; older ones rope_theta
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedModelConfig(f"rope_type {rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise UnsupportedModelConfig("config.json has neither rope_theta nor rope_parameters.rope_theta")
    return float(theta)


def _common(cfg: dict[str, Any], family: str, qkv_bias: bool, qk_norm: bool) -> ModelConfig:
    if cfg.get("use_sliding_window"):
        raise UnsupportedModelConfig("sliding-window attention is not supported")
    heads = cfg["num_attention_heads"]
    return ModelConfig(
        family=family,
        hidden=cfg["hidden_size"],
        layers=cfg["num_hidden_layers"],
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg),
        max_positions=cfg.get("max_position_embeddings", 32768),
        tied_head=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
    )


def qwen2(cfg: dict[str, Any]) -> ModelConfig:
    return _common(cfg, "qwen2", qkv_bias=True, qk_norm=False)


def qwen3(cfg: dict[str, Any]) -> ModelConfig:
    return _common(cfg, "qwen3", qkv_bias=bool(cfg.get("attention_bias", False)), qk_norm=True)


FAMILIES: dict[str, Callable[[dict[str, Any]], ModelConfig]] = {"qwen2": qwen2, "qwen3": qwen3}


def read_model_config(model_dir: Path) -> ModelConfig:
    cfg = read_config_json(Path(model_dir))
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        raise UnknownModelFamily(f"model_type {model_type!r} in {model_dir} is not supported by the "
                                 f"bounded engine; known model types: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type](cfg)
