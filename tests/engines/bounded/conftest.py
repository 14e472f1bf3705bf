"""Fixtures for the bounded engine tests: tiny preset directories and a float32
transformers reference of the label probabilities."""
from __future__ import annotations

import random

import pytest
import torch

from harness.presets import materialise

PRESETS = ("tiny", "tiny-qwen2")
VOCAB = 151936


@pytest.fixture(scope="session", params=PRESETS)
def preset_dir(request):
    return materialise(request.param, log=lambda s: None)


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
