"""The sweep section of a scenario: which task and workload parameters vary, and the check
that every value makes a valid task / workload."""
from __future__ import annotations

from typing import Any, Literal
from pydantic import ConfigDict, ValidationError

from harness.scenario.fields import Strict


# Parameters a sweep may vary, and the scenario section each belongs to.
SWEEP_PARAMS = {"beam_width": "task", "decode_steps": "task", "samples_per_request": "workload",
                "prompt_tokens": "workload", "items_per_request": "workload", "query_tokens": "workload",
                "item_tokens": "workload"}


SIZINGS = ("cell", "largest")


class Sweep(Strict):
    """`sweep:` -- task and workload parameters, each a list of values; their cross product
    are the cells, each run at every load point. `sizing`: engines sized for each cell (cell,
    the default: restarted when a cell needs other bounds) or once for the largest cell."""

    model_config = ConfigDict(extra="allow", frozen=True)  # the parameters
    sizing: Literal["cell", "largest"] = "cell"

    @property
    def params(self) -> dict[str, list[Any]]:
        return dict(self.model_extra or {})


def check_sweep_values(params: dict[str, Any], task: Any, workload: Any) -> None:
    """Every value of every swept parameter must make a valid task / workload."""
    if not params:
        raise ValueError(f"name at least one parameter to sweep; parameters: {', '.join(SWEEP_PARAMS)}")
    for name, values in params.items():
        if name not in SWEEP_PARAMS:
            raise ValueError(f"unknown sweep parameter {name!r}; parameters: {', '.join(SWEEP_PARAMS)}")
        section = {"task": task, "workload": workload}[SWEEP_PARAMS[name]]
        if section is None:
            return  # that section is invalid itself: its own error says why
        if name not in type(section).model_fields:
            raise ValueError(f"{name}: a {getattr(section, 'kind', 'synthetic')} task has no {name}")
        if name == "samples_per_request" and getattr(task, "kind", "") == "beam_search":
            raise ValueError(f"{name}: a beam_search request has one prompt; sweep beam_width or decode_steps")
        if getattr(workload, "dataset", None) is not None and name in ("beam_width", "decode_steps"):
            raise ValueError(f"{name}: the dataset's requests carry their own {name}; a sweep cannot change it")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{name}: give a non-empty list of values, e.g. {name}: [1, 2, 4]")
        if len({repr(v) for v in values}) < len(values):
            raise ValueError(f"{name}: a value is given twice")
        for i, v in enumerate(values):
            if isinstance(v, bool):
                raise ValueError(f"{name}[{i}] = {v!r}: a number is expected, not a boolean")
            try:
                type(section).model_validate({**section.model_dump(exclude_unset=True), name: v})
            except ValidationError as e:
                raise ValueError(f"{name}[{i}] = {v!r}: {e.errors()[0]['msg']}") from None
