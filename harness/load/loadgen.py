"""Load generation: closed loop (N concurrent clients) and Poisson open loop.

Each request's outcome is a `RequestRecord`. In the open loop, arrival times are drawn up
front from the seed and latency runs from the *scheduled* send time, so queueing in a slow
engine or a slow client is never hidden (no coordinated omission); the lag between
scheduled and actual send is recorded.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import numpy as np

from engines.base import Engine, EngineDied, RequestRejected
from harness.measure.records import LoadPoint, RequestRecord
from harness.workload.requests import WorkItem

SPIN_S = 0.0015  # below this, wait by yielding to the loop instead of sleeping (epoll has ms resolution)


class Items(Protocol):
    def __getitem__(self, i: int) -> WorkItem: ...


class Tick(Protocol):
    def __call__(self, n: int = 1) -> None: ...


class no_progress:
    """The progress context used when nobody watches: `with no_progress(label, total) as tick`."""

    def __init__(self, *_a):
        pass

    def __enter__(self) -> Tick:
        return lambda n=1: None

    def __exit__(self, *a) -> bool:
        return False


async def _fire(engine: Engine, rec: RequestRecord, t0: float, timeout_s: float, point: LoadPoint,
                clock=time.perf_counter) -> None:
    rec.sent = clock() - t0
    try:
        async with asyncio.timeout(timeout_s):
            rec.result = await engine.submit(rec.item.request)
        rec.status = "ok"
    except TimeoutError:
        rec.status, rec.error = "timeout", f"no answer within {timeout_s:g} s"
    except RequestRejected as e:
        rec.status, rec.error = "rejected", str(e)
    except EngineDied as e:  # every further request would fail the same way: stop sending
        rec.status, rec.error = "error", f"{type(e).__name__}: {e}"
        point.interrupted = point.interrupted or f"engine died: {e}"
    except Exception as e:  # one bad request never ends a run
        rec.status, rec.error = "error", f"{type(e).__name__}: {e}"
    rec.done = clock() - t0


async def run_closed(engine: Engine, items: Items, concurrency: int, requests: int, warmup: int,
                     timeout_s: float, tick: Tick = lambda n=1: None,
                     out: list[LoadPoint] | None = None) -> LoadPoint:
    """`concurrency` clients, each sending its next request when the last returns. The
    first `warmup` requests are a phase of their own (same clients, excluded from metrics)
    that ends before the measured phase starts, so none of their work falls inside the
    measured window. The point is appended to `out` as soon as it exists, so an
    interrupted run keeps it."""
    point = LoadPoint("closed", concurrency)
    if out is not None:
        out.append(point)
    t0 = time.perf_counter()
    next_index = 0

    async def client(end: int) -> None:
        nonlocal next_index
        while next_index < end and not point.interrupted:
            i = next_index
            next_index += 1
            rec = RequestRecord(i, items[i], i < warmup, time.perf_counter() - t0)
            point.records.append(rec)
            await _fire(engine, rec, t0, timeout_s, point)
            tick()

    for end in (warmup, warmup + requests):
        if next_index < end and not point.interrupted:
            await _gather_keeping(point, [client(end) for _ in range(concurrency)])
    return point


def poisson_schedule(rate: float, seed: int, *, duration_s: float | None = None,
                     requests: int | None = None, warmup_s: float = 0.0) -> np.ndarray:
    """Arrival times (s) of a Poisson process at `rate`, drawn up front: until
    warmup_s + duration_s, or warm-up arrivals plus `requests` measured ones."""
    rng = np.random.default_rng(seed)
    if duration_s is not None:
        horizon = warmup_s + duration_s
        n = int(rate * horizon + 10 * np.sqrt(rate * horizon) + 10)
        t = np.cumsum(rng.exponential(1.0 / rate, size=n))
        while t[-1] < horizon:
            t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, size=n))])
        t = t[t < horizon]
        return t if requests is None else t[: int(np.searchsorted(t, warmup_s)) + requests]
    assert requests is not None
    n_warm = int(np.ceil(rate * warmup_s * 1.5)) + 1
    t = np.cumsum(rng.exponential(1.0 / rate, size=n_warm + requests))
    return t[: int(np.searchsorted(t, warmup_s)) + requests]


async def run_poisson(engine: Engine, items: Items, rate: float, schedule: np.ndarray,
                      warmup_s: float, timeout_s: float, tick: Tick = lambda n=1: None,
                      out: list[LoadPoint] | None = None) -> LoadPoint:
    point = LoadPoint("poisson", rate)
    if out is not None:
        out.append(point)
    tasks: list[asyncio.Task] = []
    loop_clock = time.perf_counter
    t0 = loop_clock()

    async def fire(rec: RequestRecord) -> None:
        await _fire(engine, rec, t0, timeout_s, point)
        tick()

    try:
        for i, at in enumerate(schedule.tolist()):
            if point.interrupted:
                break
            while (delay := at - (loop_clock() - t0)) > 0:
                await asyncio.sleep(delay - SPIN_S if delay > 2 * SPIN_S else 0)
            rec = RequestRecord(i, items[i], at < warmup_s, at)
            point.records.append(rec)
            tasks.append(asyncio.create_task(fire(rec)))
        await _gather_keeping(point, tasks)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        _mark_cancelled(point)
        raise
    return point


async def _gather_keeping(point: LoadPoint, aws: list[Any]) -> None:
    """Await all; if cancelled (Ctrl-C), mark unfinished records and keep the rest."""
    try:
        await asyncio.gather(*aws)
    except asyncio.CancelledError:
        _mark_cancelled(point)
        raise


def _mark_cancelled(point: LoadPoint) -> None:
    point.interrupted = "interrupted"
    for rec in point.records:
        if rec.status == "pending":
            rec.status, rec.error = "cancelled", "run interrupted"
