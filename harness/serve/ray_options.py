"""`bench serve --ray`'s options, checked before Ray starts, and what they become in Ray Serve:
the replicas (a count or MIN:MAX autoscaling), the cluster address, CPUs and GPUs per replica;
the deployment's keyword arguments, each replica's runtime_env and the description that
`/server_info` shows."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.serve.server import ServeOptions

MAX_REPLICAS = 1024
MAX_PER_REPLICA = 1024.0  # CPUs or GPUs per replica
CODE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding harness/ and engines/
# a cluster's nodes get this code with the job (Ray uploads it; the nodes need the dependencies)
CLUSTER_JOB_ENV = {"py_modules": [str(CODE_ROOT / "harness"), str(CODE_ROOT / "engines")]}


@dataclass(frozen=True)
class RayOptions:
    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas instead of a fixed count
    address: str | None = None  # an existing cluster ("auto", "HOST:6379", "ray://HOST:10001"); None = local
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    startup_timeout_s: float = 600.0

    def __post_init__(self):
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1 (got {self.replicas})")
        if self.autoscale and not 0 <= self.autoscale[0] <= self.autoscale[1] >= 1:
            raise ValueError(f"--autoscale MIN:MAX needs 0 <= MIN <= MAX and MAX >= 1 (got {self.autoscale})")
        if not (0 < self.cpus_per_replica <= MAX_PER_REPLICA and 0 <= self.gpus_per_replica <= MAX_PER_REPLICA):
            raise ValueError(f"--cpus-per-replica must be in (0, {MAX_PER_REPLICA:g}] and --gpus-per-replica in "
                             f"[0, {MAX_PER_REPLICA:g}] (got {self.cpus_per_replica:g} and {self.gpus_per_replica:g})")
        if self.max_replicas > MAX_REPLICAS:
            raise ValueError(f"at most {MAX_REPLICAS} replicas (got {self.max_replicas})")
        if self.address is not None:
            cluster_endpoint(self.address)  # refuses a malformed address before Ray starts

    @property
    def max_replicas(self) -> int:
        return self.autoscale[1] if self.autoscale else self.replicas

    @property
    def threads(self) -> int:
        """torch threads per replica: its whole CPUs (at least one)."""
        return max(1, int(self.cpus_per_replica))


def cluster_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) that must answer for `--address` to be a cluster (None for "auto": Ray
    finds the local one); ValueError when the address is not one."""
    if address == "auto":
        return None
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--address {address!r}: give auto, HOST:PORT (e.g. 10.0.0.5:6379) or ray://HOST:PORT")
    return host, int(port)


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Refuse in seconds a cluster address nothing listens on (ray.init would retry for minutes)."""
    endpoint = cluster_endpoint(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
    except OSError as e:
        raise ValueError(f"--address {address}: no Ray cluster answers at {endpoint[0]}:{endpoint[1]} "
                         f"({e.strerror or type(e).__name__})") from None


def parse_autoscale(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(lo), int(hi)
    except ValueError:
        raise ValueError(f"--autoscale takes MIN:MAX replicas, e.g. 1:4 (got {text!r})") from None


def deployment_options(ray_opts: RayOptions, serve_opts: ServeOptions, runtime_env: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of `serve.deployment` for these options."""
    if ray_opts.autoscale:
        lo, hi = ray_opts.autoscale
        # a replica is busy when its engine slots are full; more than that waiting adds replicas
        scale = {"autoscaling_config": {"min_replicas": lo, "max_replicas": hi, "initial_replicas": max(lo, 1),
                                        "target_ongoing_requests": serve_opts.concurrency}}
    else:
        scale = {"num_replicas": ray_opts.replicas}
    return {**scale, "max_ongoing_requests": serve_opts.concurrency,
            # Ray needs at least one waiting place (-1 would be no bound)
            "max_queued_requests": max(serve_opts.max_queue, 1),
            "backpressure_config": {"status_code": 429},
            "graceful_shutdown_timeout_s": serve_opts.graceful_timeout_s,
            "ray_actor_options": {"num_cpus": ray_opts.cpus_per_replica, "num_gpus": ray_opts.gpus_per_replica,
                                  "runtime_env": runtime_env}}


def replica_runtime_env(threads: int, local: bool) -> dict[str, Any]:
    """Ray runtime_env of each replica: thread counts equal to its CPUs; on a local instance
    this code's folder (replicas run what the driver runs) and the driver's cache folder. On a
    cluster the code comes with the job instead (`CLUSTER_JOB_ENV`)."""
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if local:
        env["PYTHONPATH"] = local_pythonpath()
        env.update({k: v for k, v in os.environ.items() if k.startswith("BOUNDED_BENCH_")})
    return {"env_vars": env}


def local_pythonpath() -> str:
    return os.pathsep.join(p for p in (str(CODE_ROOT), os.environ.get("PYTHONPATH")) if p)



def describe_deployment(ray_mod, ray_opts: RayOptions, serve_opts: ServeOptions) -> dict[str, Any]:
    lo_hi = ray_opts.autoscale
    return {"server": f"ray serve {ray_mod.__version__}", "cluster": ray_opts.address or "local",
            "autoscale": f"{lo_hi[0]}:{lo_hi[1]}" if lo_hi else None, "cpus_per_replica": ray_opts.cpus_per_replica,
            "gpus_per_replica": ray_opts.gpus_per_replica, "torch_threads": ray_opts.threads,
            "max_ongoing_requests": serve_opts.concurrency, "max_queued_requests": serve_opts.max_queue}

