"""Cross-request batching: business requests wait (at most `max_wait_s` after the first one
arrives) to be merged into one model call under a budget of packed tokens, sequences and
label rows. The call runs in a worker thread so the event loop stays responsive; each
request gets its own outcome (a result or its own exception).
"""
from __future__ import annotations

import asyncio
import collections
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Budget:
    max_tokens: int  # packed tokens over the whole batch
    max_seqs: int
    max_labels: int  # distinct label ids over the whole batch


@dataclass
class Pending:
    state: dict[str, Any]  # the request-scope DAG state: "request", "seqs", "label_ids"
    stages: dict[str, float]
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def seqs(self) -> list[list[int]]:
        return self.state["seqs"]


class _Usage:
    def __init__(self) -> None:
        self.seqs, self.tokens, self.labels = 0, 0, set()

    def fits(self, p: Pending, b: Budget) -> bool:
        seqs = self.seqs + len(p.seqs)
        tokens = self.tokens + sum(map(len, p.seqs))
        labels = self.labels | set(p.state["label_ids"])
        return seqs <= b.max_seqs and tokens <= b.max_tokens and len(labels) <= b.max_labels

    def add(self, p: Pending) -> None:
        self.seqs += len(p.seqs)
        self.tokens += sum(map(len, p.seqs))
        self.labels |= set(p.state["label_ids"])


Execute = Callable[[list[Pending]], list[Any]]  # -> one result or exception per request


class Batcher:
    """Bound to the event loop it was created in."""

    def __init__(self, execute: Execute, executor: Executor, budget: Any, max_wait_s: float,
                 usage: Callable[[], Any] = _Usage):
        """`usage()` makes the tally of one batch (`fits(pending, budget)`, `add(pending)`);
        the default is the prefill rule above, beam_search.BeamUsage the beam one."""
        self.execute, self.executor, self.budget, self.max_wait_s = execute, executor, budget, max_wait_s
        self.usage = usage
        self.loop = asyncio.get_running_loop()
        self._queue: collections.deque[Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._task = self.loop.create_task(self._run())

    async def submit(self, state: dict[str, Any], stages: dict[str, float]) -> Any:
        p = Pending(state, stages, self.loop.create_future())
        self._queue.append(p)
        self._arrived.set()
        return await p.future

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._task.cancel)

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            try:
                outcomes = await self.loop.run_in_executor(self.executor, self.execute, batch)
            except Exception as e:  # the executor itself failed: every request learns why
                outcomes = [e] * len(batch)
            for p, out in zip(batch, outcomes):
                if p.future.done():  # the caller gave up
                    continue
                if isinstance(out, BaseException):
                    p.future.set_exception(out)
                else:
                    p.future.set_result(out)

    async def _collect(self) -> list[Pending]:
        first = await self._next(None)
        usage, batch = self.usage(), [first]
        usage.add(first)
        deadline = self.loop.time() + self.max_wait_s
        while True:
            nxt = await self._next(deadline)
            if nxt is None:
                return batch
            if not usage.fits(nxt, self.budget):
                self._queue.appendleft(nxt)  # first of the next batch
                return batch
            usage.add(nxt)
            batch.append(nxt)

    async def _next(self, deadline: float | None) -> Pending | None:
        """The next queued request, waiting until `deadline` (loop time; None: forever)."""
        while not self._queue:
            timeout = None if deadline is None else deadline - self.loop.time()
            if timeout is not None and timeout <= 0:
                return None
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        return self._queue.popleft()
