"""An engine that answers at once with well-formed results: measures the harness's own ceiling."""
from __future__ import annotations

from engines.base import Beam, BeamRequest, BeamResult, Engine, PrefillResult, Request, Result


class NoopEngine(Engine):
    name = "noop"
    computes = False

    def start(self) -> None:
        pass

    def describe(self) -> dict:
        return {**super().describe(), "version": "1"}

    async def submit(self, request: Request) -> Result:
        if isinstance(request, BeamRequest):
            beam = Beam([0] * request.decode_steps, "", 0.0)
            return BeamResult(request.id, [beam] * request.beam_width)
        n = len(request.labels)
        return PrefillResult(request.id, [[1.0 / n] * n] * len(request.samples))
