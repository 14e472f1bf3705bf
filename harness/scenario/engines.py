"""The engines a scenario drives, and the EngineConfig each entry starts with (sized by the
scenario's bounds, or a sweep cell's)."""
from __future__ import annotations

from pathlib import Path

from engines.base import Bounds, EngineConfig
from engines.registry import ENGINES
from harness.scenario.bounds import scenario_bounds
from harness.scenario.errors import ScenarioError
from harness.scenario.schema import EngineSpec, Scenario


def select_engines(scenario: Scenario, names: list[str] | None) -> list[EngineSpec]:
    """The engines a run drives: the scenario's, or those the command line names (`--engine
    X` takes every entry whose name or label is X, with its options, else a plain X)."""
    if not names:
        return list(scenario.engines)
    specs: list[EngineSpec] = []
    for k, n in enumerate(names):
        if n in names[:k]:
            raise ScenarioError(f"--engine {n}: given twice")
        found = [s for s in scenario.engines if n in (s.name, s.label)]
        if not found and n not in ENGINES:
            entries = ", ".join(s.title for s in scenario.engines)
            raise ScenarioError(f"--engine {n}: unknown engine; known engines: {', '.join(sorted(ENGINES))}; "
                                f"this scenario's entries: {entries}")
        specs += [s for s in found or [EngineSpec(name=n)] if s not in specs]
    return specs


def engine_config(scenario: Scenario, spec: EngineSpec, model_dir: str, device: str,
                  bounds: Bounds | None = None) -> EngineConfig:
    """An engine's config for the scenario, sized by `bounds` (default: the unswept scenario's)."""
    return EngineConfig(Path(model_dir), spec.dtype or scenario.dtype, device, bounds or scenario_bounds(scenario),
                        scenario.task.kind, spec.options)
