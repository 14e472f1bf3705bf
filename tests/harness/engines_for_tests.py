"""In-process engines for testing the harness's own logic (never the product)."""
from __future__ import annotations

import asyncio
from dataclasses import replace

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


class SlowerEngine(SlowEngine):
    """SlowEngine at 50 ms a request: over a 20 ms mean SLO at any rate."""

    name = "slower"

    def __init__(self, config):
        super().__init__(config, service_s=0.05)


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
        return replace(super().describe(), mode="eager (AOT failed)",
                       fallback="prefill_only: ToolchainMissing: AOT toolchain for cuda: CUDA headers missing")

    async def submit(self, request):
        return PrefillResult(request.id, [[0.5, 0.5]] * len(request.samples))


class PickyBeamEngine(Engine):
    """Beam search with limits of its own, for sweeps: it cannot start when sized for
    `START_FAILS` beams (as an engine running out of memory planning its buffers), rejects
    requests of `REFUSES` beams, and dies (like a crashed server, until restarted) at the
    first request of `DIES` beams. Beams are `[i, i, ...]` for i < W."""

    name = "picky"
    START_FAILS, REFUSES, DIES = 6, 5, 7
    requests: list = []  # every request any instance was sent (class-wide: tests read it)
    starts = 0

    def start(self) -> None:
        if self.config.bounds.max_beam_width == self.START_FAILS:
            raise MemoryError(f"out of memory planning buffers for {self.START_FAILS} beams")
        type(self).starts += 1
        self.dead = False

    async def submit(self, request):
        from engines.base import Beam, BeamResult, EngineDied

        type(self).requests.append(request)
        if self.dead or request.beam_width == self.DIES:
            self.dead = True
            raise EngineDied("server exited with code -9")
        if request.beam_width == self.REFUSES:
            raise RequestRejected(f"beam_width {request.beam_width}: this engine refuses it")
        await asyncio.sleep(0.001)
        return BeamResult(request.id, [Beam([i] * request.decode_steps, "", -float(i))
                                       for i in range(request.beam_width)])
