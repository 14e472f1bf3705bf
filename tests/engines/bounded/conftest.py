"""Fixtures for the bounded engine tests: tiny preset directories and a float32
transformers reference of the label probabilities."""
from __future__ import annotations

import random

import pytest
import torch

from harness.workload.presets import PRESETS as ALL_PRESETS
from harness.workload.presets import materialise, write_model

PRESETS = ("tiny", "tiny-qwen2")
VOCAB = 151936


@pytest.fixture(scope="session", params=PRESETS)
def preset_dir(request):
    return materialise(request.param, log=lambda s: None)


@pytest.fixture(scope="session", params=PRESETS)
def calm_dir(request, tmp_path_factory):
    """The tiny shapes with weights at a trained model's scale (init range 0.1 instead of the
    presets' 0.5). The presets' large weights make every layer amplify rounding (bf16 alone
    moves transformers' own label probabilities by up to 0.5 on tiny-qwen2), so bf16 accuracy
    is judged on these."""
    out = tmp_path_factory.mktemp(request.param) / "model"
    write_model({**ALL_PRESETS[request.param], "initializer_range": 0.1}, out)
    return out


class Reference:
    """transformers AutoModelForCausalLM, one sample at a time, float32."""

    def __init__(self, model_dir, dtype=torch.float32):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

    @torch.no_grad()
    def scores(self, seqs, label_ids) -> torch.Tensor:
        rows = []
        for s in seqs:
            logits = self.model(torch.tensor([list(s)]), logits_to_keep=1).logits[0, -1].float()
            rows.append(torch.softmax(logits[list(label_ids)], -1))
        return torch.stack(rows)  # [S, N]


_refs: dict = {}


def reference(model_dir, dtype=torch.float32) -> Reference:
    key = (str(model_dir), dtype)
    if key not in _refs:
        _refs[key] = Reference(model_dir, dtype)
    return _refs[key]


def random_seqs(rng: random.Random, n: int, lo: int = 1, hi: int = 500) -> list[list[int]]:
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
