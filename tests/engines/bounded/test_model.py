"""The bounded decoder (model.py via programs.ScorePrefill, eager) against transformers."""
from __future__ import annotations

import json
import random

import pytest
import torch

from engines.bounded.config import PrecisionPolicy
from engines.bounded.families import UnknownModelFamily, read_model_config
from engines.bounded.model import load_model
from engines.bounded.packing import pack
from engines.bounded.programs import ScorePrefill
from engines.bounded import kernels

from .conftest import random_seqs, reference


def _scores(model_dir, dtype, seqs, labels):
    prog = ScorePrefill(load_model(model_dir, PrecisionPolicy(dtype)))
    with torch.no_grad():
        return torch.softmax(prog(*pack(seqs).varlen_args(), torch.tensor(labels)), -1)


def test_float32_matches_transformers(preset_dir):
    rng = random.Random(0)
    seqs = random_seqs(rng, 16)
    labels = [rng.randrange(151936) for _ in range(3)]
    got = _scores(preset_dir, "float32", seqs, labels)
    want = reference(preset_dir).scores(seqs, labels)
    assert (got - want).abs().max().item() < 1e-4
    assert torch.allclose(got.sum(-1), torch.ones(len(seqs)), atol=1e-5)


def test_config_reads_both_rope_spellings(preset_dir, tmp_path):
    cfg = json.loads((preset_dir / "config.json").read_text())
    theta = cfg.pop("rope_parameters")["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_theta": theta}))
    assert read_model_config(tmp_path).rope_theta == read_model_config(preset_dir).rope_theta == theta


def test_unknown_family_lists_known_ones(tiny_dir_copy):
    cfg = json.loads((tiny_dir_copy / "config.json").read_text())
    (tiny_dir_copy / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(UnknownModelFamily, match="known model types: qwen2, qwen3"):
        load_model(tiny_dir_copy, PrecisionPolicy("float32"))


def test_packed_attention_kernels_agree():
    torch.manual_seed(0)
    lengths = [5, 1, 17, 9]
    t = sum(lengths)
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    b = pack([[0] * n for n in lengths])
    padded = kernels.packed_attention_padded(q, k, v, b.pad_index, b.unpad_index)
    loop = kernels.packed_attention_loop(q, k, v, list(b.spans))
    varlen = kernels.varlen_attention(q, k, v, b.cu_seqlens)
    gpu_path = kernels.varlen_attention_padded(q, k, v, b.cu_seqlens)  # run here on CPU tensors
    assert torch.allclose(padded, loop, atol=1e-5)
    assert torch.allclose(varlen, loop, atol=1e-5)
    assert torch.allclose(gpu_path, loop, atol=1e-5)
    # each sequence alone: attention never crosses a sequence boundary
    s, e = b.spans[2]
    alone = kernels.packed_attention_loop(q[s:e], k[s:e], v[s:e], [(0, e - s)])
    assert torch.allclose(padded[s:e], alone, atol=1e-5)


@pytest.fixture
def tiny_dir_copy(tmp_path):
    from harness.presets import materialise

    src = materialise("tiny", log=lambda s: None)
    dst = tmp_path / "m"
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    return dst
