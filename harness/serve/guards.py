"""What a request passes on its way into the engine, in `bench serve`: the content type, the
body's size and deadline, admission (a bounded queue in front of the engine), and a client's
disconnect, which cancels its request."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Awaitable, Callable

from starlette.requests import Request

from harness.serve.api import ApiError


class Admission:
    """A bounded queue in front of the engine: `concurrency` slots and `max_queue` waiters."""

    def __init__(self, concurrency: int, max_queue: int):
        self.concurrency, self.max_queue = concurrency, max_queue
        self._slots = asyncio.Semaphore(concurrency)
        self.waiting = 0
        self.running = 0

    @contextlib.asynccontextmanager
    async def slot(self):
        if self.running + self.waiting >= self.concurrency + self.max_queue:
            raise ApiError(429, f"server busy: {self.running} running and {self.waiting} queued "
                                f"(queue bound {self.max_queue}); retry later")
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()


class ClientGone(Exception):
    pass


async def until_disconnect(receive: Callable[[], Awaitable[dict]], work: Awaitable[Any]) -> Any:
    """Await `work`; if the client disconnects first, cancel it and raise ClientGone. Call
    after the body has been read: the server's `receive` then only reports the disconnect."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise ClientGone()


def require_json(request: Request) -> None:
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, f"content-type {kind or '(none)'} is not served: send the body as application/json")


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The body, whole, within `limit` bytes (else 413) and `timeout_s` seconds (else 408)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body of {declared} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"body is over the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"the body did not arrive within {timeout_s:g} s ({size} bytes came)") from None
    return b"".join(chunks)
