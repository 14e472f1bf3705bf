"""The engine a server serves, from the scenario: its model resolved, its config (the
scenario's bounds), its tokenizer and the body translator; and the public view of the server's
information (no filesystem paths)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from engines.base import EngineConfig
from engines.validate import Limits
from harness.scenario.engines import engine_config
from harness.scenario.schema import EngineSpec
from harness.scenario.task import BeamTaskSpec
from harness.serve.api import Translator
from harness.workload.presets import resolve_model
from harness.workload.requests import item_codes, load_tokenizer


@dataclass(frozen=True)
class EngineSetup:
    """What serving one engine for a scenario needs before the engine starts."""

    name: str
    config: EngineConfig
    translator: Translator


def engine_setup(scenario, engine_name: str, *, device: str | None = None, engine_options: dict | None = None,
                 log: Callable[[str], None] = print) -> EngineSetup:
    """Resolve the scenario's model; the engine's config (the scenario's bounds) and the body translator."""

    model_dir = resolve_model(scenario.model, log)
    spec = serving_spec(scenario, engine_name)
    if engine_options:
        spec = EngineSpec(**{**spec.model_dump(exclude_none=True), **engine_options})  # its label, dtype kept
    cfg = engine_config(scenario, spec, model_dir, device or scenario.device)
    tokenizer = load_tokenizer(model_dir)
    task, allowed = scenario.task, None
    if isinstance(task, BeamTaskSpec) and task.item_codes is not None:
        c = task.item_codes
        allowed = item_codes(tokenizer, c.count, c.length, c.seed)
    limits = Limits.for_model(model_dir, cfg.bounds)
    translator = Translator(tokenizer, limits.vocab or len(tokenizer), cfg.bounds, allowed, public(scenario.model),
                            limits.max_positions, limits.eos)
    return EngineSetup(spec.name, cfg, translator)


def serving_spec(scenario, engine: str):
    """The scenario's entry `engine` names: the one so labelled, else the first of that engine
    (its plain entry, e.g. `bounded` rather than `{name: bounded, label: bounded-noshare}`)."""

    found = [s for s in scenario.engines if s.title == engine] + [s for s in scenario.engines if s.name == engine]
    return found[0] if found else EngineSpec(name=engine)


_ABSOLUTE = re.compile(r"(?<![\w.:/~-])(?:/|~/)(?:[^\s/'\"]+/)*([^\s/'\"]*)")


def public(value: Any) -> Any:
    """`value` with every absolute filesystem path cut to its last part (".../name"): the
    public routes should not tell a caller how the server's disks are laid out."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda m: ".../" + m.group(1), value)
    if isinstance(value, dict):
        return {k: public(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(public(v) for v in value)
    return value
