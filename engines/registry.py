"""Engines by name. Import paths, not classes, so that `bench --help` stays light and a
heavy engine is imported only when chosen."""
from __future__ import annotations

import importlib

from engines.base import Description, Engine, EngineConfig, EngineUnavailable, PrefillRequest, Request, Result, as_samples

ENGINES: dict[str, str] = {
    "noop": "engines.noop:NoopEngine",
    "hf": "engines.hf:HFEngine",
    "bounded": "engines.bounded.engine:BoundedEngine",
    "sglang": "engines.sglang:SGLangEngine",
    "vllm": "engines.vllm:VLLMEngine",
}


class UnknownEngine(ValueError):
    pass


def engine_class(name: str) -> type[Engine]:
    if name not in ENGINES:
        raise UnknownEngine(f"unknown engine {name!r}; known engines: {', '.join(sorted(ENGINES))}")
    module_name, _, cls_name = ENGINES[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise EngineUnavailable(f"engine {name!r} cannot be imported: {e}") from e
    return getattr(module, cls_name)


def create_engine(name: str, config: EngineConfig) -> Engine:
    cls = engine_class(name)
    cls.check_available(config)
    engine = cls(config)
    return engine if cls.takes_query_requests else QueryAsSamples(engine)


class QueryAsSamples:
    """An engine that takes no query requests, handed each one's concatenations as samples
    (the same answers, no sharing); everything else is the engine's own."""

    def __init__(self, engine: Engine):
        self._engine = engine

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    async def submit(self, request: Request) -> Result:
        if isinstance(request, PrefillRequest):
            request = as_samples(request)
        return await self._engine.submit(request)

    def describe(self) -> Description:
        return self._engine.describe().with_details(query_requests="scored as their concatenations")
