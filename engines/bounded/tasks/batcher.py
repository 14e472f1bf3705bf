"""Cross-request batching: business requests wait (at most `max_wait_s` after the first one
arrives) to be merged into one model call under the task's budget (its `Usage`: packed
tokens, sequences and labels for scoring; requests with equal steps for beams). The call
runs in a worker thread so the event loop stays responsive; each request gets its own
outcome (a result or its own exception). A caller that gives up while queued costs
nothing; closing the batcher fails every request it still holds, so none waits forever.
"""
from __future__ import annotations

import asyncio
import collections
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from engines.base import EngineError


@dataclass
class Pending:
    item: Any  # the request-scope output of the task's DAG (e.g. prefill.ScoreItem, beam BeamJob)
    stages: dict[str, float]
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class Usage(Protocol):
    """The tally of one batch under a task's budget (the task's batching rule)."""

    def fits(self, p: Pending) -> bool: ...

    def add(self, p: Pending) -> None: ...


Execute = Callable[[list[Pending]], list[Any]]  # -> one result or exception per request


class Batcher:
    """Bound to the event loop it was created in."""

    def __init__(self, execute: Execute, executor: Executor, usage: Callable[[], Usage], max_wait_s: float):
        """`usage()` makes the empty tally of a new batch (the task's rule and budget)."""
        self.execute, self.executor, self.usage, self.max_wait_s = execute, executor, usage, max_wait_s
        self.loop = asyncio.get_running_loop()
        self._queue: collections.deque[Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._batch: list[Pending] = []  # the batch being collected or in the executor
        self._closed = False
        self._task = self.loop.create_task(self._run())

    async def submit(self, item: Any, stages: dict[str, float]) -> Any:
        if self._closed:
            raise EngineError("the engine is stopping; request not accepted")
        p = Pending(item, stages, self.loop.create_future())
        self._queue.append(p)
        self._arrived.set()
        return await p.future

    def close(self) -> None:
        """Stop batching (from any thread); requests not yet answered get an EngineError."""
        self._closed = True
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._task.cancel)

    async def _run(self) -> None:
        try:
            while True:
                await self._collect()
                try:
                    outcomes = await self.loop.run_in_executor(self.executor, self.execute, self._batch)
                except Exception as e:  # the executor itself failed: every request learns why
                    outcomes = [e] * len(self._batch)
                self._settle(self._batch, outcomes)
                self._batch = []
        except asyncio.CancelledError:
            self._closed = True
            stopped = EngineError("the engine stopped before answering this request")
            held = self._batch + list(self._queue)
            self._settle(held, [stopped] * len(held))
            self._queue.clear()
            raise

    @staticmethod
    def _settle(batch: list[Pending], outcomes: list[Any]) -> None:
        for p, out in zip(batch, outcomes):
            if p.future.done():  # the caller gave up
                continue
            if isinstance(out, BaseException):
                p.future.set_exception(out)
            else:
                p.future.set_result(out)

    async def _collect(self) -> None:
        """Fill `self._batch` (held there, so that closing meanwhile fails it too)."""
        first = await self._next(None)
        usage, self._batch = self.usage(), [first]
        usage.add(first)
        deadline = self.loop.time() + self.max_wait_s
        while True:
            nxt = await self._next(deadline)
            if nxt is None:
                return
            if not usage.fits(nxt):
                self._queue.appendleft(nxt)  # first of the next batch
                return
            usage.add(nxt)
            self._batch.append(nxt)

    async def _next(self, deadline: float | None) -> Pending | None:
        """The next queued request whose caller still waits, waiting until `deadline` (loop
        time; None: forever)."""
        while True:
            while not self._queue:
                timeout = None if deadline is None else deadline - self.loop.time()
                if timeout is not None and timeout <= 0:
                    return None
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), timeout)
                except asyncio.TimeoutError:
                    return None
            p = self._queue.popleft()
            if not p.future.done():  # a caller that gave up while queued never reaches the model
                return p
