"""Locust users that replay a scenario's requests against an SGLang-compatible server
(`bench serve` or a real SGLang): `/v1/score` for prefill_only, `/generate` with
`beam_width` for beam search, with the bodies the `sglang` engine sends.

`bench load` prepares the requests (tokenized, in the scenario's order) as a JSONL file and
names it in BENCH_LOCUST_REQUESTS; each user is a closed-loop client that sends its next
request when the last one returns. Worker k of K sends requests k, k+K, k+2K, ... of the
file (cycling), so all workers together replay the scenario's order.

Outcomes are recorded by name: a successful request under its route, a failed one under
"<route> failed" (so latency percentiles are over successful requests only, as in
`bench run`), with an error that starts with "rejected:" (4xx, 429 included), "timeout:" or
"error:" (5xx, bad answer, connection).

Run by hand (e.g. a worker on another machine, with the requests file `bench load` wrote):
  BENCH_LOCUST_REQUESTS=requests.jsonl BENCH_LOCUST_WORKERS=K \
    locust -f harness/load/locustfile.py --worker --master-host HOST
"""
from __future__ import annotations

import itertools
import json
import os

from locust import FastHttpUser, constant, events, task
from locust.runners import MasterRunner

from harness.load.locust import FAILED, REQUESTS_ENV, TIMEOUT_ENV, WORKERS_ENV, outcome

_pool: list[dict] = []
_sent = itertools.count()


@events.init.add_listener
def _load_requests(environment, **_kw) -> None:
    if isinstance(environment.runner, MasterRunner):
        return  # the master runs no users
    path = os.environ.get(REQUESTS_ENV)
    if not path:
        raise SystemExit(f"{REQUESTS_ENV} must name the requests file that `bench load` writes")
    with open(path) as f:
        _pool[:] = [json.loads(line) for line in f if line.strip()]
    if not _pool:
        raise SystemExit(f"{path}: no requests")


class ScenarioUser(FastHttpUser):
    wait_time = constant(0)
    network_timeout = connection_timeout = float(os.environ.get(TIMEOUT_ENV, "60"))

    @task
    def replay(self) -> None:
        workers = max(int(os.environ.get(WORKERS_ENV, "1")), 1)
        index = (next(_sent) * workers + max(self.environment.runner.worker_index, 0)) % len(_pool)
        item = _pool[index]
        route = item["route"]
        with self.client.post(route, data=item["body"], headers={"Content-Type": "application/json"},
                              name=route, catch_response=True) as resp:
            text = (resp.text or "") if resp.status_code == 200 else ""
            why = outcome(resp.status_code, getattr(resp, "error", None), text, item)
            if why is None:
                resp.success()
            else:
                resp.request_meta["name"] = route + FAILED
                resp.failure(why)
