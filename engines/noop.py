"""An engine that answers at once with well-formed results: measures the harness's own ceiling.
Requests get the shared check without a tokenizer (text is not tokenized here)."""
from __future__ import annotations

from dataclasses import replace

from engines.base import Beam, BeamRequest, BeamResult, Description, Engine, PrefillResult, Request, Result
from engines.validate import Limits, RequestChecker


class NoopEngine(Engine):
    name = "noop"
    takes_query_requests = True  # the checker gives a query request's concatenations
    computes = False

    def __init__(self, config):
        super().__init__(config)
        self.checker = RequestChecker(Limits.for_model(config.model_dir, config.bounds))

    def start(self) -> None:
        pass

    def resize(self, bounds) -> bool:
        self.config = replace(self.config, bounds=bounds)
        self.checker = RequestChecker(Limits.for_model(self.config.model_dir, bounds))
        return True

    def describe(self) -> Description:
        return replace(super().describe(), version="1")

    async def submit(self, request: Request) -> Result:
        checked = self.checker.check(request)
        if isinstance(request, BeamRequest):
            beam = Beam([0] * checked.decode_steps, "", 0.0)
            return BeamResult(request.id, [beam] * checked.beam_width)
        n = len(checked.labels)
        return PrefillResult(request.id, [[1.0 / n] * n] * len(checked.seqs))
