"""The bounded decoder (model/decoder.py via programs.prefill.ScorePrefill, eager) against
transformers."""
from __future__ import annotations

import random

import pytest
import torch

from engines.bounded.kernels.attention import ATTENTIONS
from engines.bounded.model.decoder import load_model
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.programs.prefill import ScorePrefill
from engines.bounded.runtime.buffers import pack

from ..conftest import random_seqs, reference


def _scores(model_dir, dtype, seqs, labels, attention="per_sequence"):
    prog = ScorePrefill(load_model(model_dir, PrecisionPolicy(dtype)), attention)
    with torch.no_grad():
        b = pack(seqs)
        return torch.softmax(prog(*b.varlen_args(), b.prefix, torch.tensor(labels)), -1)


@pytest.mark.parametrize("attention", ATTENTIONS)  # padded: the GPU's attention, run here
def test_float32_matches_transformers(preset_dir, attention):
    rng = random.Random(0)
    seqs = random_seqs(rng, 16)
    labels = [rng.randrange(151936) for _ in range(3)]
    got = _scores(preset_dir, "float32", seqs, labels, attention)
    want = reference(preset_dir).scores(seqs, labels)
    assert (got - want).abs().max().item() < 1e-4
    assert torch.allclose(got.sum(-1), torch.ones(len(seqs)), atol=1e-5)
