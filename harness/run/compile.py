"""`bench compile`: the bounded engine's AOT packages for a scenario, built (or found in the
cache) ahead of a run, each low-precision plan judged by the accuracy gate. The engine comes
from the registry, as in a run."""
from __future__ import annotations

from typing import Any, Callable

from engines.base import EngineUnavailable
from engines.registry import engine_class
from harness.run.sweep import plan_cells
from harness.scenario.engines import engine_config
from harness.scenario.schema import EngineSpec, Scenario
from harness.workload.presets import resolve_model

ENGINE = "bounded"  # the engine with a compile step


def compile_scenario(sc: Scenario, device: str, log: Callable[[str], None]) -> tuple[dict[str, Any], list[str]]:
    """-> ({entry title: its runtime status, or a list, one per sweep cell that needs other
    bounds}, what the accuracy gate refused, one line each). Every bounded entry of the
    scenario, or a plain one if it lists none."""
    cls = engine_class(ENGINE)
    specs = [e for e in sc.engines if e.name == ENGINE] or [EngineSpec(name=ENGINE)]
    cells = plan_cells(sc, sc.load, device, log=log).cells
    model_dir = resolve_model(sc.model, log)
    status, refused = {}, []
    for spec in specs:
        done, statuses = set(), []
        for cell in cells:  # a sweep: each cell's bounds (engines are sized per cell)
            if cell.bounds in done:
                continue
            done.add(cell.bounds)
            if cell.label:
                log(f"{spec.title}, cell {cell.label}:")
            try:
                statuses.append(cls(engine_config(cell.scenario, spec, model_dir, device, cell.bounds)).compile())
            except EngineUnavailable as e:  # the accuracy gate refused the plan (or it cannot run here)
                statuses.append({"refused": str(e)})
                refused.append(f"{spec.title}{f' ({cell.label})' if cell.label else ''}: {e}")
        status[spec.title] = statuses[0] if len(statuses) == 1 else statuses
    return status, refused
