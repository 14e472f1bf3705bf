"""`bench serve`, `bench load`, `bench soak`: an engine over HTTP, and load against a server."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional
import typer
from rich.markup import escape

from harness.serve.hosts import LOOPBACK_HOSTS, is_loopback
from harness.cli.common import EXIT_SHORT, check_writable, fail, kv_options, checked_scenario, app, console, out
from engines.base import EngineUnavailable
from engines.registry import UnknownEngine
from harness.load.locust import LoadSpec, parse_duration, run_load
from harness.load.soak import SoakSpec, run_soak, write_soak


@app.command()
def serve(
    scenario: Path = typer.Argument(..., help="Scenario YAML file: model, dtype, bounds, task."),
    engine: str = typer.Option(..., "--engine", "-e", help="Engine to serve."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    port: int = typer.Option(30000, help="Port; 0 picks a free one (printed when ready)."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: the scenario's)."),
    concurrency: int = typer.Option(4, help="Requests inside the engine at once."),
    max_queue: int = typer.Option(64, help="Requests waiting for the engine; one more is answered 429."),
    max_body_bytes: int = typer.Option(1 << 20, help="Largest request body; larger is answered 413."),
    head_timeout: float = typer.Option(10.0, help="Seconds a client has to send a request's headers (then 408)."),
    body_timeout: float = typer.Option(30.0, help="Seconds a client has to send a request's body (then 408)."),
    allowed_host: Optional[List[str]] = typer.Option(None, "--allowed-host", help="Host header name to serve "
                                                     "besides loopback ones (repeatable; '*' for any)."),
    option: Optional[List[str]] = typer.Option(None, "--option", help="Engine option KEY=VALUE."),
    ray: bool = typer.Option(False, "--ray", help="Serve replicas of the engine on Ray Serve (a local Ray "
                             "instance, or the cluster at --address)."),
    replicas: Optional[int] = typer.Option(None, help="With --ray: how many replicas (default 1)."),
    autoscale: Optional[str] = typer.Option(None, help="With --ray: MIN:MAX replicas, scaled on requests in flight."),
    address: Optional[str] = typer.Option(None, help="With --ray: join this Ray cluster (auto, HOST:6379, "
                                          "ray://HOST:10001) instead of starting a local one."),
    cpus_per_replica: Optional[float] = typer.Option(None, help="With --ray: CPUs per replica (default 1; "
                                                     "torch threads = its whole CPUs)."),
    gpus_per_replica: Optional[float] = typer.Option(None, help="With --ray: GPUs per replica (default 0)."),
) -> None:
    """Serve one engine over HTTP with SGLang's routes: /v1/score, /generate, /health, /metrics."""
    if not 0 <= port <= 65535:
        fail(f"--port {port}: give 0..65535 (0 picks a free port)")
    log = lambda m: console.print(m, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    if not ray:
        _refuse_ray_flags({"--replicas": replicas, "--autoscale": autoscale, "--address": address,
                           "--cpus-per-replica": cpus_per_replica, "--gpus-per-replica": gpus_per_replica})
    opts = _serve_options(host, concurrency, max_queue, max_body_bytes, head_timeout, body_timeout, allowed_host)
    sc = checked_scenario(scenario, engines=[engine], device=device, engine_options=kv_options(option),
                          device_here=not (ray and address))
    warn_not_loopback = lambda: _warn_not_loopback(host, opts.allowed_hosts)  # noqa: E731
    if ray:
        warn_not_loopback()
        return _serve_ray(sc, engine, opts, host, port, device, kv_options(option), replicas, autoscale, address,
                          cpus_per_replica, gpus_per_replica, log)
    _serve_here(sc, engine, opts, host, port, device, kv_options(option), log, warn_not_loopback)


def _warn_not_loopback(host: str, allowed_hosts: tuple[str, ...]) -> None:
    if not is_loopback(host):
        console.print(f"[yellow]warning:[/yellow] listening on {host}, not loopback; Host names served: "
                      f"{', '.join(allowed_hosts)} (--allowed-host adds one)", highlight=False)


def _refuse_ray_flags(flags: dict) -> None:
    given = [k for k, v in flags.items() if v is not None]
    if given:
        fail(", ".join(given) + " only apply with --ray")


def _serve_options(host, concurrency, max_queue, max_body_bytes, head_timeout, body_timeout, allowed_host):
    """The server's options from the flags; Host names served: loopback ones, the bound host
    when it is a name or address (not a wildcard), and each --allowed-host."""
    from harness.serve.server import ServeOptions

    named = [] if is_loopback(host) or host in ("0.0.0.0", "::") else [f"[{host}]" if ":" in host else host]
    try:
        return ServeOptions(concurrency, max_queue, max_body_bytes, head_timeout_s=head_timeout,
                            body_timeout_s=body_timeout,
                            allowed_hosts=LOOPBACK_HOSTS + tuple(named + (allowed_host or [])))
    except ValueError as e:
        fail(str(e))


def _serve_here(sc, engine, opts, host, port, device, engine_options, log, warn_not_loopback) -> None:
    """`bench serve` without --ray: bind, start the engine, serve until interrupted."""
    from harness.serve.server import bind, build_server, run as run_server

    try:
        sock = bind(host, port)
        server = build_server(sc, engine, opts, device=device, engine_options=engine_options, log=log)
    except (UnknownEngine, EngineUnavailable, ValueError, OSError, OverflowError) as e:
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - the engine's start broke: say so, without a traceback
        fail(f"engine {engine} failed to start: {type(e).__name__}: {e}", EXIT_SHORT)
    warn_not_loopback()
    url = f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}"
    run_server(server, sock, on_ready=lambda: print(f"serving {engine} on {url}", flush=True))


def _serve_ray(sc, engine, options, host, port, device, engine_options, replicas, autoscale, address, cpus, gpus,
               log) -> None:
    from harness.serve.ray_options import RayOptions, parse_autoscale
    from harness.serve.replicas import RayMissing, serve_replicas

    if replicas is not None and autoscale is not None:
        fail("give --replicas N or --autoscale MIN:MAX, not both")

    def ready(url: str, placement: dict) -> None:
        where = ", ".join(f"{r['replica']} on {r['node_ip']} (pid {r['pid']})" for r in placement["placement"])
        log(f"{placement['replicas']} replicas running: {where}")
        print(f"serving {engine} on {url}", flush=True)

    try:
        ray_opts = RayOptions(replicas=1 if replicas is None else replicas, address=address,
                              autoscale=parse_autoscale(autoscale) if autoscale else None,
                              cpus_per_replica=1.0 if cpus is None else cpus, gpus_per_replica=gpus or 0.0)
        serve_replicas(sc, engine, options, ray_opts, host=host, port=port, device=device,
                       engine_options=engine_options, log=log, on_ready=ready)
    except (RayMissing, UnknownEngine, EngineUnavailable, ValueError, OSError) as e:
        fail(str(e))
    except (TimeoutError, RuntimeError) as e:  # the replicas did not start
        fail(str(e), EXIT_SHORT)


@app.command()
def load(
    scenario: Path = typer.Argument(..., help="Scenario YAML file: its requests are replayed."),
    host: str = typer.Option(..., "--host", help="Server URL, e.g. http://127.0.0.1:30000 (bench serve or SGLang)."),
    users: int = typer.Option(4, help="Locust users (closed-loop clients)."),
    spawn_rate: float = typer.Option(4.0, help="Users started per second."),
    run_time: str = typer.Option("30s", help="How long to run: seconds, or 30s / 2m / 1h."),
    workers: int = typer.Option(0, help="Locust worker processes (distributed mode with a master); 0 = one process."),
    pool: int = typer.Option(1000, help="Distinct requests prepared (users cycle through them)."),
    label: Optional[str] = typer.Option(None, help="Engine name for results.csv (default: the host)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Run folder (default reports/<run-id>/)."),
) -> None:
    """Load-test a server with Locust (headless); write results.csv and run.json.

    Exit code: 0 when requests were answered, 3 when none was, 2 for bad input."""

    sc = checked_scenario(scenario, engines=[])
    folder = out_dir or Path("reports") / (time.strftime("%Y%m%d-%H%M%S") + f"-{sc.name}-locust")
    try:
        spec = LoadSpec(host.rstrip("/"), users, spawn_rate, parse_duration(run_time), workers, pool)
        row, paths = run_load(sc, scenario, spec, folder, label, sys.argv, log=lambda m: console.print(m, highlight=False, markup=False))
    except (ValueError, OSError, RuntimeError) as e:
        fail(str(e))
    out.print(f"{row['ok']}/{row['requests']} ok ({row['rejected']} rejected, {row['errors']} errors, "
              f"{row['timeouts']} timeouts); mean {row['mean_ms']:.1f} ms, p99 {row['p99_ms']:.0f} ms, "
              f"{row['qps']:.2f} req/s", highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
    if not row["ok"]:  # as `bench run`: a load test that measured nothing must not pass
        console.print(f"[red]not measured:[/red] no request to {escape(host)} was answered", highlight=False)
        raise typer.Exit(EXIT_SHORT)


@app.command()
def soak(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    engine: str = typer.Option(..., "--engine", "-e", help="Engine to serve with `bench serve`."),
    minutes: float = typer.Option(..., help="How long to soak (bounded: at most a day)."),
    fraction: float = typer.Option(0.5, help="Offered load as a fraction of the measured capacity."),
    window: float = typer.Option(30.0, help="Seconds per reported window."),
    concurrency: int = typer.Option(4, help="Server engine slots, and clients of the capacity probe."),
    max_growth: float = typer.Option(0.05, help="Resident-memory growth above which the soak fails."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Run folder (default reports/<run-id>/)."),
) -> None:
    """Serve an engine, find its capacity, run at a fraction of it; report errors and memory growth."""

    sc = checked_scenario(scenario, engines=[engine])
    log = lambda m: console.print(m, highlight=False, markup=False)  # noqa: E731
    if not 0 <= max_growth <= 100:  # NaN would pass any growth
        fail(f"--max-growth {max_growth}: give a fraction >= 0, e.g. 0.05 for 5 %")
    try:
        spec = SoakSpec(minutes, fraction, window, concurrency)
    except ValueError as e:
        fail(str(e))
    folder = out_dir or Path("reports") / (time.strftime("%Y%m%d-%H%M%S") + f"-{sc.name}-soak")
    check_writable(folder)  # before minutes of soaking
    try:
        result = run_soak(sc, scenario, engine, spec, ["--concurrency", str(concurrency)], log=log)
    except (ValueError, OSError, RuntimeError) as e:
        fail(str(e))
    paths = write_soak(result, spec, folder, {"command": sys.argv, "scenario": str(scenario)})
    ok = result.failed == 0 and not result.growth > max_growth
    out.print(f"soak {engine}: {result.requests - result.failed}/{result.requests} ok at {result.rate:.2f} req/s "
              f"({fraction:.0%} of {result.capacity_qps:.2f}); rss {result.windows[0].rss_mb:.1f} -> "
              f"{result.windows[-1].rss_mb:.1f} MB ({result.growth:+.1%}) -> {'PASS' if ok else 'FAIL'}",
              highlight=False)
    for e in result.first_errors:
        console.print(f"[yellow]error:[/yellow] {e}", highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
    if not ok:
        raise typer.Exit(1)
