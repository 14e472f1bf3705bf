"""Prometheus metrics of `bench serve` (`GET /metrics`): requests by route and status, latency,
samples per request, the engine's stage times and its own counters, queue depth, process memory."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily

from engines.base import Engine
from harness.serve.api import Translated
from harness.serve.guards import Admission

LATENCY_BUCKETS = (.001, .0025, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    """Prometheus metrics in a registry of their own (several apps may share a process)."""

    def __init__(self, admission: Admission, engine: Engine):
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        r.register(_EngineStats(engine))
        self.requests = Counter("bench_requests", "Requests answered, by route and HTTP status",
                                ["route", "code"], registry=r)
        self.latency = Histogram("bench_request_latency_seconds", "Time to answer a successful request",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.samples = Histogram("bench_request_samples", "Samples (or beams) per successful request",
                                 ["route"], buckets=SIZE_BUCKETS, registry=r)
        self.stage = Histogram("bench_engine_stage_seconds", "Per-stage times the engine reports",
                               ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        Gauge("bench_queue_depth", "Requests waiting for an engine slot",
              registry=r).set_function(lambda: admission.waiting)
        Gauge("bench_in_flight", "Requests inside the engine", registry=r).set_function(lambda: admission.running)

    def answered(self, route: str, code: int, seconds: float, t: Translated | None, result: Any) -> None:
        self.requests.labels(route, str(code)).inc()
        if code != 200 or t is None:
            return
        self.latency.labels(route).observe(seconds)
        req = t.request
        self.samples.labels(route).observe(req.num_samples if route == "/v1/score" else req.beam_width)
        for name, ms in (getattr(result, "stages", None) or {}).items():
            self.stage.labels(name).observe(ms / 1e3)


class _EngineStats:
    """Numbers an engine keeps in a `stats` dict (the bounded engine: requests, batches,
    largest_batch; mean batch size = requests / batches), read at each scrape."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        fam = GaugeMetricFamily("bench_engine_stat", "Counters the engine reports about itself", labels=["name"])
        for name, value in (getattr(self.engine, "stats", None) or {}).items():
            if isinstance(value, (int, float)):
                fam.add_metric([name], float(value))
        yield fam
