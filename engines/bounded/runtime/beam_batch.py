"""What a beam batch carries between the moves of the walk (runtime/beam.py: `prefill`,
`step(j)`, `outputs`): the jobs, the shapes chosen for the batch at its prefill, its device
metadata, and its beams -- typed, so the data path reads from the signatures.

Row layout: request r owns rows [r*W, (r+1)*W) of the W-row width bucket; rows past its
own width, and beams that died (no allowed continuation), carry score -inf.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from engines.bounded.kernels import select
from engines.bounded.kernels.constraints import ItemTrie
from engines.bounded.runtime.compiled import Graph


@dataclass(frozen=True)
class BeamJob:
    """One request as the runtime sees it."""

    prompt: Sequence[int]
    width: int
    steps: int
    trie: Optional[ItemTrie] = None
    id: str = ""


@dataclass
class BeamOutput:
    tokens: list[list[int]]  # generated tokens of each beam, best first
    scores: list[float]  # cumulative log-probabilities, same order


@dataclass
class BeamState:
    """The beams of a batch between steps: [R, W] each."""

    scores: Tensor  # float32 cumulative log-probability, -inf for dead/padding rows
    history: Tensor  # [R, W, S] int64 generated tokens so far
    nodes: Tensor  # trie node per beam (constrained requests)
    parents: Tensor  # row within the request of each beam's parent at the last step

    @classmethod
    def empty(cls, requests: int, width: int, steps: int, device: torch.device) -> BeamState:
        """No beam yet: every row dead, no token generated (step 1 chooses from the prompt)."""
        z = torch.zeros(requests, width, dtype=torch.int64, device=device)
        history = torch.zeros(requests, width, steps, dtype=torch.int64, device=device)
        return cls(torch.full((requests, width), -math.inf, device=device), history, z, z)


@dataclass
class BeamBatch:
    """One batch between the walk's moves: its jobs, the shapes chosen for it (once, at the
    prefill), its device metadata and its beams."""

    jobs: Sequence[BeamJob]
    steps: int
    width: int  # rows per request (the width bucket)
    step_graph: Graph
    rows: int  # requests a decode step runs for: R, or the captured requests bucket >= R
    prompt_stride: int  # P of the prompt K/V layout: the longest prompt, or the plan's bound (graphs)
    prompt_len: Tensor  # [rows] (padding requests: 1)
    choice: select.Choice
    row_base: Tensor  # [R, 1] first row of each request
    hidden: Optional[Tensor] = None  # [R, hidden] after the prefill, for step 1
    state: Optional[BeamState] = None

    @property
    def requests(self) -> int:
        return len(self.jobs)
