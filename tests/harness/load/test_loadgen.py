import asyncio

import numpy as np

from engines.base import EngineConfig, PrefillRequest
from harness.load.loadgen import poisson_schedule, run_closed, run_poisson
from harness.workload.requests import WorkItem
from tests.harness.engines_for_tests import FlakyEngine, SlowEngine


def _items(n):
    return [WorkItem(PrefillRequest(f"r{i}", ["x"], [" a", " b"]), (4,)) for i in range(n)]


def test_poisson_rate_and_exponential_gaps_over_a_long_draw():
    t = poisson_schedule(200.0, seed=3, duration_s=500)
    assert abs(len(t) / 500 - 200) / 200 < 0.02
    gaps = np.diff(t)
    assert abs(gaps.mean() - 1 / 200) / (1 / 200) < 0.02
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05  # exponential: coefficient of variation 1
    assert np.array_equal(t, poisson_schedule(200.0, seed=3, duration_s=500))


def test_poisson_requests_count_excludes_warmup():
    t = poisson_schedule(100.0, seed=0, requests=50, warmup_s=1.0)
    assert (t >= 1.0).sum() == 50


def test_open_loop_latency_includes_queueing_behind_a_slow_engine():
    """Arrivals faster than the service: latency must grow with the queue, measured from the
    schedule. Reference: a single FIFO server, done_i = max(arrival_i, done_{i-1}) + s."""
    service, rate = 0.02, 100.0  # 50 req/s capacity, offered 100 req/s
    sched = poisson_schedule(rate, seed=1, requests=40)
    engine = SlowEngine(EngineConfig("."), service)
    point = asyncio.run(run_poisson(engine, _items(40), rate, sched, 0.0, 30.0))
    done, expected = 0.0, []
    for a in sched:
        done = max(a, done) + service
        expected.append((done - a) * 1e3)
    got = [r.latency_ms for r in sorted(point.records, key=lambda r: r.index)]
    assert all(r.status == "ok" for r in point.records)
    assert got[-1] > 200  # queueing seen
    # a busy machine only makes sleeps longer, so the ideal queue is a lower bound
    assert all(g >= e - 5 for g, e in zip(got, expected))
    assert np.median(np.array(got) / np.array(expected)) < 1.5


def test_closed_loop_keeps_concurrency_and_marks_warmup():
    engine = SlowEngine(EngineConfig("."), 0.005)
    point = asyncio.run(run_closed(engine, _items(20), concurrency=3, requests=15, warmup=5, timeout_s=5))
    assert len(point.records) == 20
    assert sum(r.warmup for r in point.records) == 5
    assert sorted(r.index for r in point.records) == list(range(20))
    warm = [r for r in point.records if r.warmup]
    measured = [r for r in point.records if not r.warmup]
    # warm-up work never falls inside the measured window
    assert max(r.done for r in warm) <= min(r.scheduled for r in measured)


def test_errors_and_timeouts_are_records_not_exceptions():
    engine = FlakyEngine(EngineConfig("."))
    point = asyncio.run(run_closed(engine, _items(10), concurrency=10, requests=10, warmup=0, timeout_s=0.2))
    status = {r.item.request.id: r.status for r in point.records}
    assert status["r3"] == "error" and status["r7"] == "timeout"
    assert sum(s == "ok" for s in status.values()) == 8
    by_id = {r.item.request.id: r for r in point.records}
    assert "boom" in by_id["r3"].error and 190 < by_id["r7"].latency_ms < 1000


def test_a_dead_engine_ends_the_point_and_keeps_what_was_measured():
    from tests.harness.engines_for_tests import DyingEngine

    point = asyncio.run(run_closed(DyingEngine(EngineConfig("."), lives=5), _items(100), concurrency=2,
                                   requests=100, warmup=0, timeout_s=5))
    assert point.interrupted.startswith("engine died")
    assert sum(r.status == "ok" for r in point.records) == 5
    assert len(point.records) < 10  # stopped sending instead of failing all 100
    sched = poisson_schedule(500.0, seed=0, requests=200)
    point = asyncio.run(run_poisson(DyingEngine(EngineConfig("."), lives=5), _items(200), 500.0, sched, 0.0, 5))
    assert point.interrupted.startswith("engine died") and len(point.records) < 50
