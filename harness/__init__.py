"""bounded-bench harness: the benchmark around the engines. It hands an engine a model
directory, its bounds and requests, and measures what comes back; engines never import it.

The folder is the stage. Top down (a stage imports only the stages below it; checked by
tests/harness/test_layout.py):

    cli/        `bench` commands, each a thin layer over the stages below
    serve/      an engine behind SGLang's HTTP routes (`bench serve`, `--ray` replicas)
    run/        a scenario's run end to end: sweep cells, each engine through them, SLO search
    load/       how requests reach an engine: closed and Poisson loops, Locust, soak
    report/     a run's files: outputs.jsonl, results.csv, run.json, report.html
    device/     peak rates per precision, `bench doctor`
    measure/    request records -> latency, throughput, effective MFU, agreement, recall
    workload/   the model a scenario names and the requests it sends
    scenario/   the YAML file validated into a typed Scenario

Data path (`bench run`), what each stage hands the next (one request's stack at steps 4, 6 and
8 enters each harness module at most twice; checked by tests/harness/test_walk.py):

1. scenario/  YAML -> `Scenario` (model, bounds, task, workload, load, engines; sweep)
2. run/       `Scenario` -> sweep `Cell`s; per engine an `EngineConfig` (engines.base, its
              bounds) -> `create_engine` through the registry -> a started engine
3. workload/  per cell: `WorkItem`s (an `engines.base` request, its valid tokens, its item codes)
4. load/      per load point: each item through `engine.submit` (closed or Poisson, latency
              from the scheduled send) -> one `RequestRecord` each, in a `LoadPoint`
5. engines/   request -> `Result` (scores or beams, stage times); `describe()` -> `Description`
6. measure/   `LoadPoint` -> `PointMetrics` (latency, QPS, effective MFU); beams -> recall
7. run/       rows (`PointRun`) per engine -> `RunResult`
8. report/    `RunResult` -> outputs.jsonl, results.csv, requests.csv, run.json, report.html

`bench serve` takes the same engines another way: HTTP body -> serve/api (checked, translated
to an engines.base request) -> serve/guards (admission) -> `engine.submit` -> JSON answer.
"""

__version__ = "0.1.0"
