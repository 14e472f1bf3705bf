"""Sweep cells: a scenario's `sweep:` (task and workload parameters, each a list of values)
expanded into cells, their cross product, each a scenario of its own that the runner drives
through every load point. A scenario without a sweep is one cell with no parameters.

Values come from the scenario's `sweep`, then its `cpu.sweep` on a CPU, then `--sweep` on
the command line, each replacing the values of the parameters it names.

Bounds: a swept parameter sizes its bound for the cell (`sizing: cell`, the default) or for
the largest cell (`sizing: largest`), capped by the scenario's `bounds` -- so a cell past a
declared bound runs on an engine sized at the bound, which refuses its requests (a failed
cell, recorded). Parameters that are not swept keep the scenario's bounds; beam width and
steps, when the bounds leave them out, come from the task.

Requests: each cell's load points use requests no earlier cell or point used (a prefix cache
must not turn a repeat into a free answer), at offsets fixed by the plan, so every engine
gets the same requests in a cell whatever happened to it in the cells before.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import yaml

from engines.base import Bounds
from harness.scenario.bounds import bounds_for
from harness.load.modes import load_mode
from harness.scenario.sweep import SWEEP_PARAMS, check_sweep_values
from harness.scenario.schema import Scenario
from harness.scenario.fields import TokenDist
from harness.scenario.files import StrictLoader

MAX_CELLS = 1000
PROBE_STRIDE = 1_000_000  # request indices reserved for each cell's SLO probes


@dataclass(frozen=True)
class Cell:
    index: int
    params: dict[str, Any]  # swept parameter -> this cell's value ({} without a sweep)
    scenario: Scenario  # the scenario with the cell's values applied
    bounds: Bounds  # what engines are sized for in this cell
    offset: int = 0  # index of the first request of the cell's first load point
    probe_offset: int = 0  # first request of its SLO probes (--find-max-qps)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={value_text(v)}" for k, v in self.params.items())

    def values(self) -> dict[str, float]:
        """The parameters as numbers (a length distribution by its mean), for tables and plots."""
        return {k: param_number(v) for k, v in self.params.items()}


def value_text(v: Any) -> str:
    if isinstance(v, dict):
        return json.dumps(v, separators=(",", ":"))
    return f"{v:g}" if isinstance(v, float) else str(v)


def param_number(v: Any) -> float:
    if isinstance(v, dict):
        return float(v["mean"])
    if isinstance(v, TokenDist):
        return float(v.mean)
    return float(v)


def parse_sweep_option(texts: Sequence[str]) -> dict[str, list[Any]]:
    """`--sweep beam_width=25,100,400` (repeatable, a parameter once) -> {"beam_width": [25,
    100, 400]}. The values are read as one YAML flow list, so a distribution is one value:
    `--sweep 'prompt_tokens={mean: 32, min: 16, max: 48},64'`."""

    out: dict[str, list[Any]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise ValueError(f"--sweep {text!r}: expected NAME=V1,V2,... e.g. --sweep beam_width=25,100,400; "
                             f"parameters: {', '.join(SWEEP_PARAMS)}")
        if name in out:
            raise ValueError(f"--sweep {name}: given twice; give all its values at once, e.g. {name}=1,2,4")
        try:
            parsed = yaml.load(f"[{values}]", Loader=StrictLoader)  # noqa: S506 - safe loader, no aliases
        except yaml.YAMLError as e:
            raise ValueError(f"--sweep {text!r}: cannot read the values ({' '.join(str(e).split())})") from None
        out[name] = parsed
    return out


def swept_values(scenario: Scenario, device: str, override: dict[str, list[Any]] | None = None,
                 log: Callable[[str], None] = lambda m: None) -> dict[str, list[Any]]:
    params = dict(scenario.sweep.params) if scenario.sweep else {}
    cpu = scenario.cpu.sweep if device == "cpu" and scenario.cpu else None
    if cpu and not override:
        log("on a CPU: sweeping the scenario's cpu.sweep values ("
            + "; ".join(f"{k}={','.join(map(value_text, v))}" for k, v in cpu.items()) + "); --sweep overrides")
    params.update(cpu or {})
    if override:
        try:
            check_sweep_values(override, scenario.task, scenario.workload)
        except ValueError as e:
            raise ValueError(f"--sweep: {e}") from None
        params.update(override)
    return params


def apply(scenario: Scenario, values: dict[str, Any]) -> Scenario:
    """The scenario with one cell's parameter values in its task and workload."""
    upd = {}
    for section in ("task", "workload"):
        mine = {k: v for k, v in values.items() if SWEEP_PARAMS[k] == section}
        if mine:
            part = getattr(scenario, section)
            upd[section] = type(part).model_validate({**part.model_dump(exclude_unset=True), **mine})
    return scenario.model_copy(update=upd)


@dataclass
class SweepPlan:
    cells: list[Cell] = field(default_factory=list)
    sizing: str = "cell"

    @property
    def swept(self) -> list[str]:
        return list(self.cells[0].params) if self.cells else []


def plan_cells(scenario: Scenario, load: Any, device: str, override: dict[str, list[Any]] | None = None,
               log: Callable[[str], None] = lambda m: None) -> SweepPlan:
    """Every cell of the sweep, in order (the last parameter varies fastest)."""
    params = swept_values(scenario, device, override, log)
    cells = math.prod(len(v) for v in params.values())
    if cells > MAX_CELLS:
        raise ValueError(f"sweep: {cells:,} cells ({' x '.join(str(len(v)) for v in params.values())} values) "
                         f"> {MAX_CELLS:,}; sweep fewer values at once")
    combos = [dict(zip(params, vs)) for vs in itertools.product(*params.values())] or [{}]
    scenarios = [apply(scenario, c) for c in combos]
    sizing = scenario.sweep.sizing if scenario.sweep else "cell"
    mode, seed = load_mode(load), scenario.workload.seed
    per_cell = sum(mode.size(load, v, seed) for v in mode.levels(load))
    sweep_total = per_cell * len(combos)
    cells = []
    for i, (values, sc) in enumerate(zip(combos, scenarios)):
        bounds = bounds_for(scenario, scenarios if sizing == "largest" else [sc], list(params))
        cells.append(Cell(i, values, sc, bounds, offset=i * per_cell, probe_offset=sweep_total + i * PROBE_STRIDE))
    return SweepPlan(cells, sizing)
