"""In-process engines for testing the harness's own logic (never the product)."""
from __future__ import annotations

import asyncio

from engines.base import Engine, EngineError, PrefillResult, RequestRejected


class SlowEngine(Engine):
    """A single server with a fixed service time: requests queue behind each other."""

    name = "slow"

    def __init__(self, config, service_s: float = 0.02):
        super().__init__(config)
        self.service_s = service_s
        self._lock = asyncio.Lock()

    def start(self) -> None:
        pass

    async def submit(self, request):
        async with self._lock:
            await asyncio.sleep(self.service_s)
        return PrefillResult(request.id, [[0.5, 0.5]] * len(request.samples))


class FlakyEngine(Engine):
    """Fails every request whose id ends in a chosen digit; rejects ids ending in 'r'."""

    name = "flaky"

    def start(self) -> None:
        pass

    async def submit(self, request):
        if request.id.endswith("3"):
            raise EngineError("boom")
        if request.id.endswith("7"):
            await asyncio.sleep(10)
        return PrefillResult(request.id, [[0.5, 0.5]] * len(request.samples))


class DyingEngine(Engine):
    """Serves `lives` requests, then every request raises EngineDied (a server that exited)."""

    name = "dying"

    def __init__(self, config, lives: int = 3):
        super().__init__(config)
        self.lives = lives

    def start(self) -> None:
        pass

    async def submit(self, request):
        from engines.base import EngineDied

        self.lives -= 1
        if self.lives < 0:
            raise EngineDied("server exited with code 1")
        await asyncio.sleep(0.001)
        return PrefillResult(request.id, [[0.5, 0.5]] * len(request.samples))


class BrokenStartEngine(Engine):
    """Its start raises (a bug, not 'unavailable')."""

    name = "broken"

    def start(self) -> None:
        raise RuntimeError("weights are corrupt")

    async def submit(self, request):
        raise AssertionError("never started")


class RejectingEngine(Engine):
    """Rejects every request: it runs, and measures nothing."""

    name = "rejecting"

    def start(self) -> None:
        pass

    async def submit(self, request):
        raise RequestRejected("no thanks")


class FallbackEngine(Engine):
    """Answers, but says it serves otherwise than asked (as bounded does when AOT fails)."""

    name = "fallback"

    def start(self) -> None:
        pass

    def describe(self):
        return {**super().describe(), "mode": "eager (AOT failed)",
                "fallback": "prefill_only: ToolchainMissing: AOT toolchain for cuda: CUDA headers missing"}

    async def submit(self, request):
        return PrefillResult(request.id, [[0.5, 0.5]] * len(request.samples))
