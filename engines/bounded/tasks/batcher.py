"""Work-conserving cross-request batching, in one model thread per task.

A business request goes from the caller's event loop to the task's model thread in one
hand-off, and its answer comes back in one: the thread runs the request scope (check and
tokenize: `prepare`, a bad request fails alone there), merges what is waiting into one call
under the task's budget (its `Usage`: packed tokens, sequences and labels for scoring;
requests with equal steps for beams), runs it and settles each caller's future.

The policy is work-conserving: an idle model takes the first request at once, and the
requests that arrive while a call runs are merged into the next call -- so batches grow with
the load and a lone request never waits for company. `max_wait_s` (default 0) is an upper
bound, for those who want fuller batches at the cost of latency: an idle model then holds a
batch that still has room until that long after its first request, or until it is full.
A lone request's small call may split across the OpenMP team; while others wait (or were
merged into the call) it stays on one thread, so the callers keep a core
(runtime/compiled.threads_for, `host_busy`).

A caller that gives up while queued costs nothing; closing fails every request still held,
so none waits forever. The engine's tasks share `model_lock`: one call at a time.

`setup` (the task's start: load, allocate, warm up) runs on the model thread before it
serves, so the process's OpenMP work has one master. GNU OpenMP (torch's) gives each thread
that opens a parallel region its own team, and once its teams' threads outnumber the CPUs its
idle workers spin 100 times instead of ~300,000 before they sleep on a futex: every parallel
region then wakes its workers through the kernel. Measured on a 2-core AMD EPYC (Zen 3), one
small GEMM ([360, 64] x [64, 256], float32, 2 threads) on a thread of its own: ~77 us, and
~100-120 us once another thread had opened a team (the engine's warm-up on the caller's
thread did).
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from engines.base import EngineError
from engines.bounded.runtime.compiled import host_busy


@dataclass
class Pending:
    item: Any  # the request, then the request scope's output (e.g. prefill.ScoreItem, a BeamJob)
    stages: dict[str, float]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.perf_counter)

    def gone(self) -> bool:
        """Did the caller give up (its future was cancelled)?"""
        return self.future.done()

    def settle(self, outcome: Any) -> None:
        """Hand the outcome to the caller's loop (from any thread)."""
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future, outcome)
        except RuntimeError:  # the caller's loop is closed: nobody waits
            pass


def _resolve(future: asyncio.Future, outcome: Any) -> None:
    if future.done():  # the caller gave up
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class Usage(Protocol):
    """The tally of one batch under a task's budget (the task's batching rule)."""

    def fits(self, p: Pending) -> bool: ...

    def add(self, p: Pending) -> None: ...

    def full(self) -> bool: ...  # nothing more can fit


Execute = Callable[[list[Pending]], list[Any]]  # -> one result or exception per request
Prepare = Callable[[Any, dict[str, float]], Any]  # request, its stage times -> the batched item
Setup = Callable[[], None]  # run on the model thread before it serves


class Batcher:
    def __init__(self, execute: Execute, usage: Callable[[], Usage], max_wait_s: float = 0.0,
                 prepare: Optional[Prepare] = None, model_lock: Optional[threading.Lock] = None,
                 name: str = "bounded-model", setup: Optional[Setup] = None):
        """`usage()` makes the empty tally of a new batch (the task's rule and budget);
        `prepare` is the request scope (None: requests are submitted prepared); `setup` runs
        on the model thread first (`ready` waits for it)."""
        self.execute, self.usage, self.max_wait_s, self.prepare = execute, usage, max_wait_s, prepare
        self._setup, self._set_up, self._setup_error = setup, threading.Event(), None
        self.model_lock = model_lock or threading.Lock()
        self._cond = threading.Condition()
        self._arrived: collections.deque[Pending] = collections.deque()  # not yet prepared
        self._ready: collections.deque[Pending] = collections.deque()  # prepared, waiting for a call
        self._running: list[Pending] = []  # the call in the model now
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def ready(self, timeout: Optional[float] = None) -> None:
        """Wait until `setup` has run on the model thread; re-raise what it raised."""
        if not self._set_up.wait(timeout):
            raise TimeoutError(f"{self._thread.name}: setup still running after {timeout} s")
        if self._setup_error is not None:
            raise self._setup_error

    async def submit(self, request: Any, stages: dict[str, float]) -> Any:
        loop = asyncio.get_running_loop()
        p = Pending(request, stages, loop.create_future(), loop)
        with self._cond:
            if self._closed:
                raise EngineError("the engine is stopping; request not accepted")
            self._arrived.append(p)
            self._cond.notify()
        return await p.future

    def close(self) -> None:
        """Stop batching (from any thread): every request not yet answered, the running
        call's included, gets an EngineError now; the model thread ends after that call."""
        with self._cond:
            self._closed = True
            _fail([*self._running, *list(self._ready), *self._arrived])  # the model thread clears them
            self._arrived.clear()
            self._cond.notify()

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait for the model thread to end (after `close`: the running call finishes)."""
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # --- the model thread -------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            if self._setup is not None:
                with self.model_lock:  # the tasks start one at a time, as they run
                    self._setup()
        except BaseException as e:  # the starter learns why (ready); this thread serves nothing
            self._setup_error = e
            with self._cond:
                self._closed = True
            return
        finally:
            self._set_up.set()
        while True:
            batch = self._collect()
            if batch is None:
                return
            self._running = batch
            t0 = time.perf_counter()
            for p in batch:
                p.stages["queue"] = (t0 - p.enqueued) * 1000.0 - p.stages.get("tokenize", 0.0)
            # other requests waiting, or several merged: the callers' side is busy, and a
            # small call leaves it a core (runtime/compiled.threads_for)
            busy = len(batch) > 1 or bool(self._ready) or bool(self._arrived)
            try:
                with self.model_lock, host_busy(busy):
                    outcomes = self.execute(batch)
            except Exception as e:  # the executor itself failed: every request learns why
                outcomes = [e] * len(batch)
            for p, out in zip(batch, outcomes):
                p.settle(out)
            self._running = []

    def _collect(self) -> Optional[list[Pending]]:
        """The next batch: at once when anything is ready (what arrived during the last call
        included); with max_wait_s, held while it has room, at most that long. None: closed."""
        usage, batch, deadline = self.usage(), [], None
        while True:
            with self._cond:
                while not (self._arrived or self._closed or self._ready and not batch) \
                        and (not batch or deadline is not None):
                    timeout = None if deadline is None else deadline - time.perf_counter()
                    if timeout is not None and timeout <= 0:
                        break
                    self._cond.wait(timeout)
                if self._closed:
                    self._fail_held(batch)
                    return None
                arrived = list(self._arrived)
                self._arrived.clear()
            self._prepare(arrived)
            full = self._fill(usage, batch)
            if batch and (full or deadline is None and self.max_wait_s <= 0
                          or deadline is not None and time.perf_counter() >= deadline):
                return batch
            if batch and deadline is None:
                deadline = batch[0].enqueued + self.max_wait_s

    def _prepare(self, arrived: list[Pending]) -> None:
        """The request scope of each new request; a bad one is answered here, alone."""
        for p in arrived:
            if p.gone():
                continue
            if self.prepare is not None:
                try:
                    p.item = self.prepare(p.item, p.stages)
                except Exception as e:
                    p.settle(e)
                    continue
            self._ready.append(p)

    def _fill(self, usage: Usage, batch: list[Pending]) -> bool:
        """Move ready requests into `batch` in arrival order while they fit; -> full (the
        next one does not fit)."""
        while self._ready:
            p = self._ready[0]
            if p.gone():
                self._ready.popleft()
                continue
            if batch and not usage.fits(p):
                return True
            usage.add(self._ready.popleft())
            batch.append(p)
        return usage.full()

    def _fail_held(self, batch: list[Pending]) -> None:
        """(model thread, holding the lock) `batch` and every request still held fail."""
        _fail([*batch, *self._ready, *self._arrived])
        self._ready.clear()
        self._arrived.clear()


def _fail(held: list[Pending]) -> None:
    stopped = EngineError("the engine stopped before answering this request")
    for p in held:
        p.settle(stopped)
