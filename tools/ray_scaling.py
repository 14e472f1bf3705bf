"""Requests/s of one engine's Ray Serve replicas, measured by `bench run` through the served
URL: the scenario's `{name: sglang, url: ...}` engine, closed loop. Each configuration (1
replica, then 2, by default, with 1 CPU each) is served with `bench serve --ray` on that URL's
port, measured, and stopped before the next; the table gives each one's figures and its
requests/s over the first's.

Beside the figures it says where this machine's CPU went while `bench run` ran (Linux /proc):
each replica's busy cores (at most its CPUs: torch threads = its CPUs), the CPU time of
replicas, Ray's own processes (proxy, router, controller, raylet, GCS) and the client per
request, and the cores busy in processes that are none of these (other work on the machine).

    /work/bin/heavy bench python tools/ray_scaling.py          # scenarios/ray_replicas.yaml, hf, 1 vs 2
    python tools/ray_scaling.py --engine hf --replicas 1 2 --cpus-per-replica 1 --requests 40
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

from harness.scenario.files import load_scenario
from harness.load.process import ServeProcess

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def served_port(scenario: Path) -> int:
    sc = load_scenario(scenario)
    urls = [e.options.get("url") for e in sc.engines if e.name == "sglang" and e.options.get("url")]
    if not urls:
        raise SystemExit(f"{scenario}: needs an engine {{name: sglang, url: ...}} to measure through")
    return urlparse(urls[0]).port or 80


def cpu_times() -> dict[int, tuple[float, str]]:
    """CPU seconds (user + system) and command line of every process now; {} off Linux."""
    out = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
        out[int(entry.name)] = ((int(fields[11]) + int(fields[12])) / TICK, cmd)
    return out


def cpu_use(before, after, replicas: list[int], serve_pid: int, client_pid: int) -> dict[str, float]:
    """CPU seconds spent between two `cpu_times()` per group: each replica, Ray's other processes
    (and the `bench serve` driver), the client, everything else."""
    spent = {pid: t - before.get(pid, (0.0, ""))[0] for pid, (t, _) in after.items()}
    groups = {f"replica {pid}": spent.get(pid, 0.0) for pid in replicas}
    ray = client = other = 0.0
    for pid, t in spent.items():
        cmd = after[pid][1]
        if pid in replicas:
            continue
        if pid == client_pid:
            client += t
        elif pid == serve_pid or "ray" in cmd.lower():
            ray += t
        else:
            other += t
    return {**groups, "ray": ray, "client": client, "other": other}


def measure(args, n: int, out: Path) -> dict:
    serve_args = ["--ray", "--replicas", str(n), "--cpus-per-replica", f"{args.cpus_per_replica:g}",
                  "--concurrency", str(args.replica_concurrency)]
    run_dir = out / f"replicas-{n}"
    extra = ["--requests", str(args.requests)] if args.requests else []
    with ServeProcess(args.scenario, args.engine, serve_args, port=served_port(args.scenario),
                      startup_timeout_s=600, log_path=out / f"serve-{n}.log") as served:
        info = httpx.get(f"{served.url}/server_info", timeout=60).json()["deployment"]
        replicas = [p["pid"] for p in info["placement"] if p["state"] == "RUNNING"]
        print(f"{n} replica(s) x {args.cpus_per_replica:g} CPU, {args.replica_concurrency} requests in each "
              f"at most: bench run ...", flush=True)
        idle = cpu_times()
        time.sleep(args.idle_s)  # Ray's own processes when no request runs: its control loops
        before = cpu_times()
        idle_cores = cpu_use(idle, before, replicas, served.pid, -1)["ray"] / args.idle_s
        t0 = time.monotonic()
        client = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(args.scenario), "--out",
                                   str(run_dir), *extra])
        _, status, usage = os.wait4(client.pid, 0)  # the client's CPU time comes with its exit
        client.returncode = os.waitstatus_to_exitcode(status)
        wall, after = time.monotonic() - t0, cpu_times()
        after[client.pid] = (usage.ru_utime + usage.ru_stime, "bench run")
        if client.returncode != 0:
            raise SystemExit(f"bench run failed (exit {client.returncode})")
    with open(run_dir / "results.csv") as f:
        row = next(csv.DictReader(f))
    use = cpu_use(before, after, replicas, served.pid, client.pid)
    served_requests = sum(1 for _ in open(run_dir / "requests.csv")) - 1  # warm-up ones too
    result = {"replicas": n, "row": row, "wall_s": wall, "served_requests": served_requests, "cpu_s": use,
              "ray_idle_cores": idle_cores}
    (run_dir / "cpu.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", type=Path, default=Path("scenarios/ray_replicas.yaml"))
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cpus-per-replica", type=float, default=1.0)
    ap.add_argument("--replica-concurrency", type=int, default=4,
                    help="bench serve --concurrency: requests inside one replica at once (its "
                         "max_ongoing_requests); the rest wait at Ray's router (default 4, as bench serve)")
    ap.add_argument("--idle-s", type=float, default=5.0, help="seconds Ray's idle CPU is measured before each run")
    ap.add_argument("--requests", type=int, help="measured requests per configuration (default: the scenario's)")
    ap.add_argument("--out", type=Path, help="folder for the runs (default reports/<time>-ray-scaling)")
    args = ap.parse_args()
    out = args.out or Path("reports") / f"{time.strftime('%Y%m%d-%H%M%S')}-ray-scaling"
    out.mkdir(parents=True, exist_ok=True)
    results = [measure(args, n, out) for n in args.replicas]
    base = float(results[0]["row"]["qps"])
    print(f"\n{'replicas':>8} {'ok/req':>7} {'mean ms':>8} {'p99 ms':>8} {'req/s':>6} {'ratio':>6}  "
          f"{'replica cores':<13}  {'CPU ms/req: replica':>19} {'ray':>4} {'client':>6}  {'ray idle':>8} {'other':>6}")
    for r in results:
        row, cpu, wall, k = r["row"], r["cpu_s"], r["wall_s"], r["served_requests"]
        reps = [t for name, t in cpu.items() if name.startswith("replica ")]
        # a replica's busy cores while requests ran: its CPU for the measured ones over their window
        share = int(row["requests"]) / k
        busy = " ".join(f"{t * share / float(row['window_s']):.2f}" for t in reps)
        ray_per_request = (cpu["ray"] - r["ray_idle_cores"] * wall) / k
        print(f"{r['replicas']:>8} {row['ok'] + '/' + row['requests']:>7} {float(row['mean_ms']):>8.1f} "
              f"{float(row['p99_ms']):>8.1f} {float(row['qps']):>6.2f} {float(row['qps']) / base:>5.2f}x  "
              f"{busy:<13}  {1000 * sum(reps) / k:>19.0f} {1000 * ray_per_request:>4.0f} "
              f"{1000 * cpu['client'] / k:>6.0f}  {r['ray_idle_cores']:>8.2f} {cpu['other'] / wall:>6.2f}")
    print(f"replica cores: busy cores of each replica while the measured requests ran; CPU ms per request "
          f"(warm-up too): the replicas', Ray's beyond its idle load, the client's (its start included); "
          f"ray idle, other: cores busy in Ray's processes when idle, and in processes that are none of "
          f"these during the run. Runs in {out}")

if __name__ == "__main__":
    main()
