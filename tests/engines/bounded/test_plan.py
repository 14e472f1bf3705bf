"""The plan: every size, from the bounds and the options (hand-computed)."""
from __future__ import annotations

from engines.base import Bounds
from engines.bounded.options import BoundedOptions
from engines.bounded.plan import BeamGraphPlan, BeamPlan, PrefillPlan, plan


def test_defaults_size_one_full_request_and_512_beam_rows():
    p = plan(Bounds(max_samples_per_request=15, max_prompt_tokens=96, max_beam_width=100, max_decode_steps=4),
             BoundedOptions())
    assert p.prefill == PrefillPlan(max_tokens=15 * 96, max_seqs=8 * 15, max_len=96, max_labels=64)
    assert p.beam == BeamPlan(max_requests=5, max_width=100, max_steps=4, max_prompt=96)  # 512 // 100
    assert (p.beam.max_rows, p.beam.suffix_slots, p.beam.max_positions, p.beam.widths) == (500, 2, 100, (100,))


def test_options_override_and_sequences_never_exceed_the_token_budget():
    b = Bounds(max_samples_per_request=4, max_prompt_tokens=500, max_beam_width=400, max_decode_steps=5)
    p = plan(b, BoundedOptions(max_batch_tokens=256, max_batch_seqs=3, max_labels=2, max_batch_beams=1000))
    assert p.prefill == PrefillPlan(max_tokens=256, max_seqs=3, max_len=256, max_labels=2)
    assert p.beam.max_requests == 2 and p.beam.max_rows == 800 and p.beam.suffix_slots == 3
    wide = plan(Bounds(max_beam_width=600), BoundedOptions())  # a width past 512 rows: one request
    assert wide.beam.max_requests == 1


def test_package_sizes_of_the_beam_graphs():
    bp = BeamPlan(max_requests=4, max_width=100, max_steps=2, max_prompt=32)
    assert bp.graph(0) == BeamGraphPlan(width=0, max_requests=4, max_prompt=32, suffix_slots=1, max_positions=34)
    assert bp.graph(100) == BeamGraphPlan(100, 4, 32, 1, 34)
    assert bp.graph(16).max_requests == 25  # a narrower bucket fits more requests in the planned rows
