"""What the load stage hands the measure stage: one record per request (its outcome, and its
scheduled, sent and done times) and the load point they belong to. Metrics are computed
from these records only, never inside the load generator."""
from __future__ import annotations

from dataclasses import dataclass, field

from engines.base import Result
from harness.workload.requests import WorkItem


@dataclass
class RequestRecord:
    index: int
    item: WorkItem
    warmup: bool
    scheduled: float  # seconds from the load point's start
    sent: float = float("nan")
    done: float = float("nan")
    status: str = "pending"  # ok | error | rejected | timeout
    error: str = ""
    result: Result | None = None

    @property
    def latency_ms(self) -> float:
        return (self.done - self.scheduled) * 1e3

    @property
    def send_lag_ms(self) -> float:
        return (self.sent - self.scheduled) * 1e3

    @property
    def stages(self) -> dict[str, float]:
        return getattr(self.result, "stages", None) or {}


@dataclass
class LoadPoint:
    mode: str  # closed | poisson
    value: float  # concurrency or rate
    records: list[RequestRecord] = field(default_factory=list)
    interrupted: str = ""  # why the point ended early, if it did
