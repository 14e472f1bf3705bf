"""The bounds engines are started with, from a scenario: its `bounds`, with the beam width
and steps of its task where the bounds leave them out, and -- in a sweep -- each swept
parameter's bound sized for the cells an engine runs (capped by the scenario's bounds)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from engines.base import Bounds
from harness.scenario.task import BeamTaskSpec
from harness.scenario.schema import Scenario
from harness.scenario.fields import TokenDist


def _top(v: Any) -> int:
    """The largest value a number or a length distribution gives."""
    return v.max if isinstance(v, TokenDist) else int(v or 0)


# where a swept parameter's bound lives in engines.base.Bounds, and what a scenario needs of it
BOUND_OF = {"beam_width": "max_beam_width", "decode_steps": "max_decode_steps",
            "samples_per_request": "max_samples_per_request", "items_per_request": "max_samples_per_request",
            "prompt_tokens": "max_prompt_tokens", "query_tokens": "max_query_tokens",
            "item_tokens": "max_item_tokens"}
NEED: dict[str, Callable[[Scenario], int]] = {
    "beam_width": lambda sc: sc.task.beam_width, "decode_steps": lambda sc: sc.task.decode_steps,
    "samples_per_request": lambda sc: sc.workload.samples_per_request,
    **{p: (lambda sc, p=p: _top(getattr(sc.workload, p)))
       for p in ("items_per_request", "prompt_tokens", "query_tokens", "item_tokens")},
}


def bounds_for(base: Scenario, sized: Sequence[Scenario], swept: Sequence[str]) -> Bounds:
    """Engine bounds for requests of the `sized` scenarios (one cell, or all of them): the
    scenario's bounds, with each swept parameter's sized for them (capped by the scenario's)."""
    b = base.bounds
    out: dict[str, Any] = {"max_samples_per_request": b.max_samples_per_request, "max_prompt_tokens": b.max_prompt_tokens,
                           "max_query_tokens": b.max_query_tokens or b.max_prompt_tokens,
                           "max_item_tokens": b.max_item_tokens or b.max_prompt_tokens,
                           "max_beam_width": b.max_beam_width, "max_decode_steps": b.max_decode_steps}
    for p in ("beam_width", "decode_steps"):  # unless the bounds say, a beam bound is the task's
        k = BOUND_OF[p]
        if not isinstance(base.task, BeamTaskSpec):
            out[k] = 1
        elif out[k] is None or p in swept:
            need = max(NEED[p](s) for s in sized)
            out[k] = need if out[k] is None else min(need, out[k])
    for p in swept:
        if p not in ("beam_width", "decode_steps"):
            out[BOUND_OF[p]] = min(max(NEED[p](s) for s in sized), out[BOUND_OF[p]])
    return Bounds(**out, on_violation=b.on_violation)


def scenario_bounds(scenario: Scenario) -> Bounds:
    """The bounds of an unswept run of `scenario` (bench serve, bench soak, bench infer)."""
    return bounds_for(scenario, [scenario], [])
