"""The beam walk's batch data: an empty state has no live beam and no generated token, so
step 1's choice starts from the prompt alone."""
from __future__ import annotations

import math

import torch

from engines.bounded.runtime.beam_batch import BeamState


def test_empty_state_has_every_row_dead_and_no_tokens():
    s = BeamState.empty(3, 4, 5, torch.device("cpu"))
    assert s.scores.shape == (3, 4) and s.scores.dtype == torch.float32
    assert bool((s.scores == -math.inf).all())
    assert s.history.shape == (3, 4, 5) and s.history.dtype == torch.int64 and not s.history.any()
    assert s.nodes.shape == s.parents.shape == (3, 4) and not s.nodes.any() and not s.parents.any()
