"""`bench serve --ray`: replicas of an engine behind Ray Serve's HTTP proxy, on a local Ray
instance or a cluster.

Each replica is a Ray actor that starts its own engine (`server.build_server`, torch threads =
its CPUs) and answers with the very routes of `bench serve` (`Server.app()`, handed to
`serve.ingress`): the same body checks, `/health`, `/metrics`, `/server_info`. Batching is the
engine's own (Ray's `@serve.batch` is not used); `max_ongoing_requests` is the serve options'
`concurrency` (requests inside one engine), `max_queued_requests` their `max_queue` (one more
is a 429, as from `bench serve`). Requests wait at Ray's router, not inside a replica, so a
replica that dies takes only the requests running on it; Ray starts a new one.

Without an address a local Ray instance is started (its processes on loopback when the HTTP
host is, no dashboard) and stopped at the end; with one, the application joins that cluster
and is deleted from it at the end.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable

from engines.registry import engine_class
from harness.serve.api import ApiError
from harness.serve.engine import engine_setup
from harness.serve.hosts import is_loopback
from harness.serve.ray_options import (CLUSTER_JOB_ENV, RayOptions, check_reachable, deployment_options,
                                       describe_deployment, local_pythonpath, replica_runtime_env)
from harness.serve.server import ServeOptions, build_server

INSTALL_HINT = 'pip install -e ".[ray]"  (or: pip install "ray[serve]==2.60.0")'
APP_NAME = "bench"

# Ray's per-request access log and INFO lines cost CPU on every request; warnings still show
QUIET = {"log_level": "WARNING", "enable_access_log": False}
# Ray Serve's hook for middlewares in its HTTP proxy (read where the proxy starts)
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "harness.serve.replicas:proxy_middlewares"


class RayMissing(RuntimeError):
    pass


def require_ray(loopback: bool = False):
    """Import Ray Serve, or say how to install it. `loopback`: a local instance listens on
    127.0.0.1 only (Ray reads this at import; it never needs other machines)."""
    if loopback:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise RayMissing(f"bench serve --ray needs Ray Serve, which is not installed here ({e}); "
                         f"install it with: {INSTALL_HINT}") from None
    return ray, serve


class EngineReplica:
    """One replica: its own engine behind `bench serve`'s routes. Ray builds it with
    `serve.ingress()`, which asks `__serve_build_asgi_app__` for the ASGI app."""

    def __init__(self, scenario, engine_name: str, serve_opts: ServeOptions, device: str | None,
                 engine_options: dict, threads: int, deployment: dict[str, Any]):
        import torch

        torch.set_num_threads(threads)
        self.server = build_server(scenario, engine_name, serve_opts, device=device, engine_options=engine_options,
                                   log=lambda m: print(m, flush=True))
        self.server.info["deployment"] = deployment
        self.server.live_info = lambda: {"deployment": {**deployment, **_placement_or_nothing()}}

    def __serve_build_asgi_app__(self):
        return self.server.app()

    def __del__(self):
        # Ray calls this when the replica stops (after its in-flight requests drained)
        server = getattr(self, "server", None)
        if server is not None:
            server.close()
            server.engine.stop()


class ReplicaFailed:
    """ASGI middleware in Ray's proxy. When the replica serving a request dies (or Ray cannot
    reach it) before answering, the proxy sends nothing and the client would get a bare
    "Internal Server Error"; this answers SGLang's JSON error shape saying what happened."""

    MESSAGE = ("the replica serving this request failed before answering (its process died or "
               "Ray could not reach it); Ray Serve replaces failed replicas, other requests are unaffected")

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, receive, watched)
        if not started:
            from starlette.responses import JSONResponse

            await JSONResponse(ApiError(500, self.MESSAGE).payload(), status_code=500)(scope, receive, send)


def proxy_middlewares() -> list:
    from starlette.middleware import Middleware

    return [Middleware(ReplicaFailed)]


def placement(app_name: str = APP_NAME) -> dict[str, Any]:
    """Replicas of the application now: how many run, and where (node, pid) each one is."""
    app = _details().applications.get(app_name)
    replicas = [r for d in (app.deployments.values() if app else ()) for r in d.replicas]
    rows = [{"replica": r.replica_id, "state": str(r.state.value), "node_ip": r.node_ip, "node_id": r.node_id,
             "pid": r.pid} for r in replicas]
    return {"replicas": sum(row["state"] == "RUNNING" for row in rows), "placement": rows,
            "status": str(app.status.value) if app else "NOT_STARTED"}


def _placement_or_nothing() -> dict[str, Any]:
    try:
        return placement(APP_NAME)
    except Exception:  # noqa: BLE001 - the controller is restarting: /server_info still answers
        return {}


def _details():
    """The controller's details: the public schema behind `serve status`, fetched with Serve's
    own client (the dashboard, which would serve them too, is not started)."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeInstanceDetails

    return ServeInstanceDetails(**_get_global_client().get_serve_details())


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_replicas(scenario, engine_name: str, serve_opts: ServeOptions, ray_opts: RayOptions, *, host: str,
                   port: int, device: str | None = None, engine_options: dict | None = None,
                   log: Callable[[str], None] = print, on_ready: Callable[[str, dict], None] = lambda url, p: None,
                   stop: threading.Event | None = None) -> None:
    """Deploy the replicas, call `on_ready(url, placement)`, serve until SIGINT/SIGTERM (or
    `stop`), then delete the application (in-flight requests finish) and stop a local Ray."""

    local = ray_opts.address is None
    ray, serve = require_ray(loopback=local and is_loopback(host))
    # fail fast, before Ray starts: unknown engine, unusable options, missing model
    setup = engine_setup(scenario, engine_name, device=device, engine_options=engine_options, log=log)
    engine_class(setup.name).check_available(setup.config)
    if setup.config.device.startswith("cuda") and ray_opts.gpus_per_replica == 0:
        raise ValueError(f"device {setup.config.device} needs GPUs: give --gpus-per-replica (e.g. 1)")
    if ray_opts.gpus_per_replica > 0 and not setup.config.device.startswith("cuda"):
        log(f"warning: replicas get {ray_opts.gpus_per_replica:g} GPU each but the engine runs on "
            f"{setup.config.device} (--device cuda to use them)")
    stop = stop or threading.Event()
    previous: dict = {}
    try:
        _start_ray(ray, ray_opts, log)
        # after ray.init, which sets a SIGTERM handler of its own (sys.exit)
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        url = _deploy(ray, serve, scenario, engine_name, serve_opts, ray_opts, host, port or free_port(host),
                      device, engine_options or {}, log, stop)
        if url:
            on_ready(url, placement())
            stop.wait()
            log("stopping: requests in flight finish, then the replicas stop ...")
    finally:
        try:
            _teardown(ray, serve, log)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _start_ray(ray, ray_opts: RayOptions, log: Callable[[str], None]) -> None:
    if ray_opts.address is None:
        cpus = os.cpu_count() or 1
        need = ray_opts.max_replicas * ray_opts.cpus_per_replica
        if need > cpus:
            raise ValueError(f"{ray_opts.max_replicas} replicas x {ray_opts.cpus_per_replica:g} CPUs need {need:g} "
                             f"CPUs; this machine has {cpus}: use fewer replicas, a smaller --cpus-per-replica, "
                             f"or --address to join a cluster")
        log(f"starting a local Ray instance ({cpus} CPUs, no dashboard) ...")
        # every process of a local instance imports this code: the proxy's error middleware too
        os.environ["PYTHONPATH"] = local_pythonpath()
        os.environ[PROXY_CALLBACK_ENV] = PROXY_CALLBACK
        # "local": a new instance even if another runs on this machine (`ray start`), never that one
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, object_store_memory=128 << 20,
                 logging_level="warning")
    else:
        check_reachable(ray_opts.address)
        log(f"joining the Ray cluster at {ray_opts.address} ...")
        ray.init(address=ray_opts.address, logging_level="warning", runtime_env=CLUSTER_JOB_ENV)
        have = ray.cluster_resources().get("CPU", 0)
        need = ray_opts.max_replicas * ray_opts.cpus_per_replica
        if need > have:
            log(f"warning: replicas need {need:g} CPUs, the cluster has {have:g} now; replicas wait for nodes")


def _deploy(ray, serve, scenario, engine_name, serve_opts, ray_opts, host, port, device, engine_options,
            log, stop: threading.Event) -> str | None:
    """Start Serve's proxy and the application; wait (with progress) until it runs. -> URL, or
    None if stopped first."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's own INFO lines
    serve.start(http_options={"host": host, "port": port}, logging_config=QUIET)
    deployment = describe_deployment(ray, ray_opts, serve_opts)
    opts = deployment_options(ray_opts, serve_opts, replica_runtime_env(ray_opts.threads, ray_opts.address is None))
    replica = serve.deployment(name=f"{engine_name}-replica", logging_config=QUIET, **opts)(
        serve.ingress()(EngineReplica))
    app = replica.bind(scenario, engine_name, serve_opts, device, engine_options, ray_opts.threads, deployment)
    scale = (f"{ray_opts.autoscale[0]} to {ray_opts.autoscale[1]}" if ray_opts.autoscale else str(ray_opts.replicas))
    log(f"deploying {scale} replicas of {engine_name} ({ray_opts.cpus_per_replica:g} CPU, "
        f"{ray_opts.gpus_per_replica:g} GPU, {ray_opts.threads} torch threads each) ...")
    outcome: dict[str, BaseException | None] = {}

    def run() -> None:
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
            outcome["error"] = None
        except BaseException as e:  # reported by the waiting thread
            outcome["error"] = e

    threading.Thread(target=run, daemon=True, name="serve-run").start()
    deadline, seen = time.monotonic() + ray_opts.startup_timeout_s, None
    while "error" not in outcome:
        if stop.wait(1.0):
            return None
        now = _progress(serve)
        if now != seen:
            log(f"  {now}")
            seen = now
        if time.monotonic() > deadline:
            raise TimeoutError(f"the replicas did not start within {ray_opts.startup_timeout_s:g} s ({now})")
    if outcome["error"] is not None:
        raise RuntimeError(f"Ray Serve could not start the replicas: {outcome['error']}") from outcome["error"]
    http = _details().http_options  # a cluster's proxy may have been started earlier, with its own
    return f"http://{_url_host(ray, http.host or host)}:{http.port or port}"


def _progress(serve) -> str:
    app = serve.status().applications.get(APP_NAME)
    if app is None:
        return "waiting for the application"
    states = {k: v for d in app.deployments.values() for k, v in d.replica_states.items()}
    message = next((d.message for d in app.deployments.values() if d.message), app.message)
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items())) or "no replicas yet"
    return f"{app.status.value.lower()}: {counts}" + (f" ({message})" if message else "")


def _url_host(ray, host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return ray.util.get_node_ip_address()
    return f"[{host}]" if ":" in host else host


def _teardown(ray, serve, log: Callable[[str], None]) -> None:
    if not ray.is_initialized():
        return
    try:
        serve.delete(APP_NAME)  # proxies stop routing to it; replicas drain, then stop their engines
    except Exception as e:  # noqa: BLE001 - still stop Ray
        log(f"warning: could not delete the application: {e}")
    ray.shutdown()  # a local instance stops whole; a cluster keeps running without our application
