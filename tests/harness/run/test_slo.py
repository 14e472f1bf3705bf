"""Max-QPS-under-SLO search: the bracketing/bisection logic against known thresholds, and the
whole search against a single FIFO server with a fixed service time, whose max rate under
the SLO comes from simulating the same M/D/1 queue on the same arrivals."""
import asyncio
import math
from dataclasses import replace

import numpy as np
import pytest

from engines.base import EngineConfig, PrefillRequest
from harness.measure.records import LoadPoint, RequestRecord
from harness.load.loadgen import poisson_schedule, run_closed
from harness.measure.metrics import latency_summary, summarise
from harness.scenario.load import Slo
from harness.run.slo import UNIT_SHAPE, MAX_PROBES, ProbeLoad, find_max_qps, search_max_rate, unreachable, verdict
from harness.workload.requests import WorkItem
from tests.harness.engines_for_tests import SlowEngine


def _threshold_probe(threshold, calls):
    async def probe(rate):
        calls.append(rate)
        return rate <= threshold

    return probe


@pytest.mark.parametrize("start", [10.0, 37.0, 60.0])
def test_search_brackets_then_bisects_to_the_threshold(start):
    calls = []
    met, missed = asyncio.run(search_max_rate(_threshold_probe(37.3, calls), start))
    assert len(calls) <= MAX_PROBES
    assert met <= 37.3 < missed
    assert (37.3 - met) / 37.3 < 0.05


def test_search_far_from_the_threshold_stays_within_the_probe_budget():
    calls = []
    met, missed = asyncio.run(search_max_rate(_threshold_probe(37.3, calls), 1000.0))
    assert len(calls) == MAX_PROBES and calls[:2] == [1000.0, 500.0]
    assert met <= 37.3 < missed and met > 0


def test_search_stops_when_a_probe_says_no_lower_rate_can_meet():
    calls = []

    async def probe(rate):
        calls.append(rate)
        return None

    assert asyncio.run(search_max_rate(probe, 50.0)) == (0.0, 50.0)
    assert calls == [50.0]


def test_search_never_meeting_and_always_meeting():
    assert asyncio.run(search_max_rate(_threshold_probe(0.0, []), 8.0)) == (0.0, 8.0 / 2 ** (MAX_PROBES - 1))
    met, missed = asyncio.run(search_max_rate(_threshold_probe(math.inf, []), 1.0))
    assert met == 2.0 ** (MAX_PROBES - 1) and missed == math.inf


def _items(n):
    return [WorkItem(PrefillRequest(f"r{i}", ["x"], [" a", " b"]), (4,)) for i in range(n)]


def _point(latencies_ms, status="ok"):
    point = LoadPoint("poisson", 1.0)
    for i, lat in enumerate(latencies_ms):
        rec = RequestRecord(i, _items(1)[0], False, 0.0, 0.0, lat / 1e3, status)
        point.records.append(rec)
    return point


def test_verdict_names_the_missed_bounds_and_unreachable_slo():
    slo = Slo(mean_ms=20, p99_ms=50)
    good = summarise(_point([10, 12, 14]), UNIT_SHAPE, float("nan"))
    assert verdict(good, slo) == (True, "")
    slow = summarise(_point([10, 12, 100]), UNIT_SHAPE, float("nan"))
    ok, why = verdict(slow, slo)
    assert not ok and "mean 40.7 ms > 20 ms" in why and "P99" in why
    assert not unreachable(_point([10, 12, 100]), slo)
    assert unreachable(_point([25, 30, 40]), slo)  # the fastest is already over the mean bound


def _md1_latencies(rate, service_s, n, seed):
    """Single FIFO server, fixed service: done_i = max(arrival_i, done_{i-1}) + s."""
    done, out = 0.0, []
    for a in poisson_schedule(rate, seed, requests=n):
        done = max(a, done) + service_s
        out.append((done - a) * 1e3)
    return out


def _md1_max_rate(service_s, n, seed, slo):
    """Highest rate meeting the SLO on these arrivals (latency grows with the rate, since
    the arrivals at any rate are one draw scaled by 1/rate): bisection to 0.1%."""
    lo, hi = 0.01 / service_s, 3 / service_s
    while hi - lo > 1e-3 * lo:
        mid = (lo + hi) / 2
        s = latency_summary(_md1_latencies(mid, service_s, n, seed))
        lo, hi = (mid, hi) if s["mean_ms"] <= slo.mean_ms and s["p99_ms"] <= slo.p99_ms else (lo, mid)
    return lo


def _search_a_fifo_server(service, n, seed, slo):
    """One calibration + search against a fresh FIFO server -> (effective service s, result)."""
    engine = SlowEngine(EngineConfig("."), service)

    async def calibrate_then_search():
        # the service time the queue really sees on this machine (sleep and lock hand-over
        # add a little): the rate of a saturated closed loop
        cal = await run_closed(engine, _items(35), concurrency=3, requests=30, warmup=5, timeout_s=5)
        effective = 1 / summarise(cal, UNIT_SHAPE, float("nan")).qps
        return effective, await find_max_qps(engine, _items(n * (MAX_PROBES + 2)), slo, ProbeLoad(seed, requests=n),
                                             start=1 / effective, first=n)

    return asyncio.run(calibrate_then_search())


def test_finds_the_max_rate_of_a_fifo_server_within_ten_percent():
    # Timing on a shared machine: a scheduling stall of another process can push one latency
    # (P99 of 30 is the max) over the bound. Up to three tries; the test fails only when a
    # try on a calm machine (calibrated service within 30 % of the sleep) misses, and is
    # skipped, saying why, when no try found the machine calm.
    service, n, seed = 0.015, 30, 5
    slo = Slo(mean_ms=2.5 * service * 1e3, p99_ms=6 * service * 1e3)
    misses, busy = [], []
    for _ in range(3):
        effective, result = _search_a_fifo_server(service, n, seed, slo)
        if not service <= effective < 1.3 * service:
            busy.append(f"{effective * 1e3:.1f} ms")
            continue
        expected = _md1_max_rate(effective, n, seed, slo)
        if abs(result.max_rate - expected) / expected < 0.10:
            break
        misses.append((result.max_rate, expected, result.summary()))
    else:
        if not misses:
            pytest.skip(f"the machine is too busy to time a 15 ms server: calibrated service {busy}")
        pytest.fail(f"max rate off by more than 10 % on a calm machine: {misses}")
    assert 1 <= len(result.probes) <= MAX_PROBES
    assert result.best.rate == result.max_rate and result.best.meets
    assert result.lowest_failed > result.max_rate
    assert all(p.meets == (p.rate <= result.max_rate) for p in result.probes)
    # every probe sent requests no earlier probe (nor the first n, the sweep's) sent
    sent = [int(r.item.request.id[1:]) for p in result.probes for r in p.point.records]
    assert len(set(sent)) == len(sent) and min(sent) >= n


def _probe(rate, mean_ms, meets=False):
    from harness.run.slo import Probe
    m = replace(summarise(_point([mean_ms] * 3), UNIT_SHAPE, float("nan")), load_value=rate)
    return Probe(rate, meets, "" if meets else "mean over", m)


def test_latency_that_rose_as_the_rate_fell_is_named():
    from harness.measure.metrics import IDLE_RISE, latency_rose_as_rate_fell
    from harness.run.slo import SearchResult
    slo = Slo(mean_ms=20, p99_ms=70)
    # queueing: latency falls with the rate -- nothing to say
    healthy = [_probe(100, 60), _probe(50, 25), _probe(25, 12, True), _probe(37.5, 18, True)]
    assert latency_rose_as_rate_fell([p.metrics for p in healthy]) is None
    res = SearchResult(slo, healthy, max_rate=37.5, lowest_failed=50)
    assert not any("rose as the rate fell" in w for w in res.warnings("e"))
    # an engine on a machine that slows while idle: 24 req/s at 21 ms, lower rates slower
    idle = [_probe(97, 56), _probe(49, 23), _probe(24, 21), _probe(12, 30), _probe(6, 37), _probe(3, 63)]
    low, high = latency_rose_as_rate_fell([p.metrics for p in idle])
    assert (low.load_value, high.load_value) == (3, 24)  # the lowest rate over IDLE_RISE x a higher one's, the fastest
    assert low.mean_ms > IDLE_RISE * high.mean_ms
    res = SearchResult(slo, idle)
    warned = [w for w in res.warnings("hf") if "rose as the rate fell" in w]
    assert len(warned) == 1 and warned[0].startswith("hf: SLO search: mean latency rose as the rate fell "
                                                     "(63.0 ms at 3 req/s, 21.0 ms at 24 req/s)")
    # two points at one rate are not a trend
    assert latency_rose_as_rate_fell([_probe(10, 40).metrics, _probe(10, 12).metrics]) is None
    # closed-loop points are not rates: left out
    closed = replace(idle[-1].metrics, load_mode="closed")
    assert latency_rose_as_rate_fell([closed, idle[2].metrics]) is None
