"""The profiler ranges the engine opens around its calls -- `bounded::graph` (a compiled
package), `bounded::head`, `bounded::select` -- which `bench profile` reads
(harness/measure/profile.py), opened only while a profiler records: torch's
`record_function` costs ~6 us a call even when none does (a Xeon, 2026-12-07), a third of a
percent of the tiny model's whole scoring request per range."""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

_NONE = contextlib.nullcontext()


def span(name: str) -> ContextManager:
    """A profiler range named `name` while torch's profiler records, else nothing."""
    return torch.profiler.record_function(name) if torch.autograd.profiler._is_profiler_enabled else _NONE
