"""The load-mode registry: each mode's points, sizes and overrides, and the runner driving a
mode it knows only through the registry."""
import asyncio
from dataclasses import dataclass

import pytest

from engines.base import EngineConfig, PrefillRequest
from engines.noop import NoopEngine
from harness.measure.records import LoadPoint
from harness.load.loadgen import no_progress, poisson_schedule
from harness.load.modes import LOAD_MODES, LoadOverrides, UnknownLoadMode, load_mode
from harness.run.engine_run import drive
from harness.scenario.load import ClosedLoad, PoissonLoad
from harness.workload.requests import WorkItem

CLOSED = ClosedLoad(mode="closed", concurrency=[1, 3], requests=4, warmup_requests=2)
POISSON = PoissonLoad(mode="poisson", rate=[50.0, 100.0], requests=6, warmup_s=0.05)


def test_unknown_mode_lists_the_known_ones():
    @dataclass
    class Odd:
        mode: str = "bursty"

    with pytest.raises(UnknownLoadMode, match="'bursty'; known modes: closed, poisson"):
        load_mode(Odd())


def test_levels_sizes_and_labels():
    closed, poisson = load_mode(CLOSED), load_mode(POISSON)
    assert closed.levels(CLOSED) == [1, 3] and closed.size(CLOSED, 3, 0) == 6
    assert closed.label(3) == "concurrency 3"
    sched = poisson_schedule(100.0, 7, requests=6, warmup_s=0.05)
    assert poisson.levels(POISSON) == [50.0, 100.0] and poisson.size(POISSON, 100.0, 7) == len(sched)
    assert poisson.label(100.0) == "rate 100/s"


def test_overrides_apply_to_the_mode_they_belong_to():
    notes = []
    ov = LoadOverrides(requests=9, duration_s=2.0, concurrency=[2], rate=[5.0])
    assert load_mode(CLOSED).override(CLOSED, ov, notes.append) == {"requests": 9, "concurrency": [2]}
    assert any("--duration applies to poisson" in n for n in notes) and any("--rate" in n for n in notes)
    notes.clear()
    assert load_mode(POISSON).override(POISSON, ov, notes.append) == {"requests": 9, "duration_s": 2.0,
                                                                       "rate": [5.0]}
    assert notes == ["--concurrency applies to closed load only; poisson load uses --rate"]
    # a request count alone sizes a Poisson point: the scenario's duration is dropped
    assert load_mode(POISSON).override(POISSON, LoadOverrides(requests=3), notes.append) == {
        "requests": 3, "duration_s": None}


def test_probe_sizes_follow_the_mode():
    p = load_mode(CLOSED).probe_load(CLOSED, 4)
    assert (p.seed, p.requests, p.warmup_requests, p.duration_s) == (4, 4, 2, None)
    q = load_mode(POISSON).probe_load(POISSON, 4)
    assert (q.requests, q.warmup_s, q.warmup_requests) == (6, 0.05, 0)


@dataclass(frozen=True)
class BurstLoad:
    mode: str = "burst"
    bursts: tuple[int, ...] = (2, 5)


class BurstMode:
    """All of a point's requests at once: a mode the runner has never heard of."""

    name = "burst"

    def levels(self, load):
        return list(load.bursts)

    def label(self, value):
        return f"burst {value:g}"

    def size(self, load, value, seed):
        return int(value)

    async def drive(self, engine, items, load, value, seed, tick, out):
        from harness.load.loadgen import run_closed

        return await run_closed(engine, items, int(value), int(value), 0, 5.0, tick, out)


def test_the_runner_drives_a_registered_mode(monkeypatch):
    monkeypatch.setitem(LOAD_MODES, "burst", BurstMode())
    items = [WorkItem(PrefillRequest(f"r{i}", ["x"], [" a", " b"]), (1,)) for i in range(7)]
    points: list[LoadPoint] = []
    used = asyncio.run(drive(NoopEngine(EngineConfig(".")), items, BurstLoad(), 0, no_progress, points))
    assert used == 7 and [p.value for p in points] == [2, 5]
    assert [[r.item.request.id for r in p.records] for p in points][1] == [f"r{i}" for i in range(2, 7)]
