"""uvicorn's h11 protocol with a deadline on each request's head (request line and headers).

uvicorn closes a keep-alive connection that stays idle after a response, but it has no
deadline on a head that never completes: a client that connects and sends nothing, or
half a header, holds its connection (and delays a graceful shutdown) for as long as it
likes. Here every connection must deliver a complete head within `head_timeout_s` of
opening, and again of each response; past that it gets a 408 and is closed. The body has
its own deadline in the route handlers (`server.read_body`).
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HeadDeadlineProtocol(H11Protocol):
    head_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a new request's head has arrived whole
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the next head is due (uvicorn's keep-alive timer closes an idle one sooner)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and not self.transport.is_closing():
            self.transport.write(TIMEOUT_408)
            self.transport.close()


def with_head_timeout(seconds: float) -> type[HeadDeadlineProtocol]:
    """The protocol class for uvicorn's `http=` setting, with this deadline."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_timeout_s": seconds})
