"""Engines by name, and query requests for engines that take none (their concatenations)."""
import asyncio

import pytest

import engines.registry as reg
from engines.base import EngineConfig, PrefillRequest, RequestRejected


def test_an_engine_without_query_support_gets_the_concatenations(tiny_dir, monkeypatch):
    monkeypatch.setitem(reg.ENGINES, "slow", "tests.harness.engines_for_tests:SlowEngine")
    seen = []
    engine = reg.create_engine("slow", EngineConfig(tiny_dir))
    orig = engine._engine.submit

    async def spy(req):
        seen.append(req)
        return await orig(req)

    engine._engine.submit = spy
    res = asyncio.run(engine.submit(PrefillRequest.with_query("q", " is it", [" a", " b c"], [1, 2])))
    assert len(res.scores) == 2 and seen[0].samples == [" is it a", " is it b c"] and not seen[0].has_query
    asyncio.run(engine.submit(PrefillRequest.with_query("i", [1, 2], [[3], [4]], [1, 2])))
    assert seen[1].samples == [[1, 2, 3], [1, 2, 4]]
    assert engine.describe().details["query_requests"] == "scored as their concatenations"
    assert engine.name == "slow" and engine.computes
    with pytest.raises(RequestRejected, match="all text or all token ids"):
        asyncio.run(engine.submit(PrefillRequest.with_query("m", [1, 2], [" x"], [1, 2])))


def test_engines_that_take_query_requests_are_not_wrapped(tiny_dir):
    assert type(reg.create_engine("hf", EngineConfig(tiny_dir))).__name__ == "HFEngine"
    assert type(reg.create_engine("noop", EngineConfig(tiny_dir))).__name__ == "NoopEngine"
