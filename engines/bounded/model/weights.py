"""Reading an HF model directory: config.json and safetensors weights (single file or shards)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open


class ModelDirError(ValueError):
    pass


def read_config_json(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelDirError(f"{model_dir} is not a model directory: no config.json")
    return json.loads(path.read_text())


def weight_files(model_dir: Path) -> list[Path]:
    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    raise ModelDirError(f"{model_dir} has no model.safetensors (or model.safetensors.index.json)")


def fingerprint(model_dir: Path) -> str:
    """Cheap identity of a model's weights and config: path, size and mtime of each file."""
    model_dir = Path(model_dir).resolve()
    parts = [str(model_dir)]
    for f in [model_dir / "config.json", *weight_files(model_dir)]:
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


class WeightReader:
    """Tensors by HF name, converted to `dtype` on `device` when read."""

    def __init__(self, model_dir: Path, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self._where: dict[str, Path] = {}
        for f in weight_files(model_dir):
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    self._where[k] = f

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise ModelDirError(f"weight {name!r} is missing from the model directory")
        with safe_open(str(self._where[name]), framework="pt") as sf:
            t = sf.get_tensor(name)
        return t.to(device=self.device, dtype=self.dtype).contiguous()

    def names(self) -> Iterator[str]:
        return iter(self._where)
