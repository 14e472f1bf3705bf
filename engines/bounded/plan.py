"""Every size the engine plans for, from the declared bounds and the engine options: the
packed-prefill call (token budget, sequence and label limits) and the beam batch (requests
per decode step, width buckets, steps, prompt), and the sizes each compiled package is
built for. Buffers are allocated from these at start; a request only fills them.
"""
from __future__ import annotations

from dataclasses import dataclass

from engines.base import Bounds
from engines.bounded.options import BoundedOptions


@dataclass(frozen=True)
class PrefillPlan:
    """The largest scoring call: the batcher's budget and the compiled graph's dynamic-dim
    maxima (part of its cache key)."""

    max_tokens: int  # T: packed tokens per call (the batch token budget)
    max_seqs: int  # S: sequences per call
    max_len: int  # L: tokens per sequence
    max_labels: int = 256  # N: distinct label ids per call


@dataclass(frozen=True)
class BeamGraphPlan:
    """The sizes one beam package is compiled for (part of its cache key)."""

    width: int  # rows per request of a step graph (0: the prefill)
    max_requests: int
    max_prompt: int
    suffix_slots: int
    max_positions: int  # rows of the rotary tables baked into the graph


@dataclass(frozen=True)
class BeamPlan:
    """What the beam buffers and graphs are sized for."""

    max_requests: int  # requests whose beams share one decode step
    max_width: int
    max_steps: int
    max_prompt: int

    @property
    def max_rows(self) -> int:
        return self.max_requests * self.max_width

    @property
    def suffix_slots(self) -> int:
        # pass j (1..S-1) reads the K/V of generated tokens 1..j-1
        return max(self.max_steps - 2, 1)

    @property
    def max_positions(self) -> int:
        return self.max_prompt + self.max_steps

    @property
    def widths(self) -> tuple[int, ...]:
        """The width buckets that get a compiled step graph (a request runs in the smallest
        bucket >= its width)."""
        return (self.max_width,)

    def request_buckets(self, width: int) -> tuple[int, ...]:
        """The request counts a captured decode step of bucket `width` is replayed at (CUDA
        graphs have fixed shapes): powers of two up to the requests the plan batches, and that
        count; a batch runs at the smallest bucket >= its requests (the rest: padding rows)."""
        top = min(self.max_requests, self.graph(width).max_requests)
        return tuple(sorted({1 << i for i in range(top.bit_length()) if 1 << i < top} | {top}))

    def graph(self, width: int) -> BeamGraphPlan:
        """The package sizes of the step graph of bucket `width` (0: the prefill)."""
        requests = max(1, self.max_rows // width) if width else self.max_requests
        return BeamGraphPlan(width, requests, self.max_prompt, self.suffix_slots, self.max_positions)


@dataclass(frozen=True)
class Plan:
    prefill: PrefillPlan
    beam: BeamPlan


def plan(bounds: Bounds, options: BoundedOptions) -> Plan:
    tokens = options.max_batch_tokens or bounds.max_samples_per_request * bounds.max_prompt_tokens
    seqs = options.max_batch_seqs or 8 * bounds.max_samples_per_request
    prefill = PrefillPlan(tokens, seqs, min(bounds.max_prompt_tokens, tokens), options.max_labels)
    rows = options.max_batch_beams or max(bounds.max_beam_width, 512)  # several requests' beams
    requests = max(1, rows // bounds.max_beam_width)  # each planned at the full width
    beam = BeamPlan(requests, bounds.max_beam_width, bounds.max_decode_steps, bounds.max_prompt_tokens)
    return Plan(prefill, beam)
