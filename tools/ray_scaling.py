"""Requests/s of one engine's Ray Serve replicas, measured by `bench run` through the served
URL: the scenario's `{name: sglang, url: ...}` engine, closed loop. Each configuration (1
replica, then 2, by default, with 1 CPU each) is served with `bench serve --ray` on that URL's
port, measured, and stopped before the next; the table gives each one's figures and its
requests/s over the first's.

    /work/bin/heavy bench python tools/ray_scaling.py          # scenarios/ray_replicas.yaml, hf, 1 vs 2
    python tools/ray_scaling.py --engine hf --replicas 1 2 --cpus-per-replica 1 --requests 40
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from harness.scenario import load_scenario
from harness.serve.process import ServeProcess


def served_port(scenario: Path) -> int:
    sc = load_scenario(scenario)
    urls = [e.options.get("url") for e in sc.engines if e.name == "sglang" and e.options.get("url")]
    if not urls:
        raise SystemExit(f"{scenario}: needs an engine {{name: sglang, url: ...}} to measure through")
    return urlparse(urls[0]).port or 80


def measure(args, n: int, out: Path) -> dict:
    serve_args = ["--ray", "--replicas", str(n), "--cpus-per-replica", f"{args.cpus_per_replica:g}"]
    run_dir = out / f"replicas-{n}"
    extra = ["--requests", str(args.requests)] if args.requests else []
    with ServeProcess(args.scenario, args.engine, serve_args, port=served_port(args.scenario),
                      startup_timeout_s=600, log_path=out / f"serve-{n}.log"):
        print(f"{n} replica(s) x {args.cpus_per_replica:g} CPU: bench run ...", flush=True)
        subprocess.run([sys.executable, "-m", "harness.cli", "run", str(args.scenario), "--out", str(run_dir),
                        *extra], check=True)
    with open(run_dir / "results.csv") as f:
        return next(csv.DictReader(f))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", type=Path, default=Path("scenarios/ray_replicas.yaml"))
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cpus-per-replica", type=float, default=1.0)
    ap.add_argument("--requests", type=int, help="measured requests per configuration (default: the scenario's)")
    ap.add_argument("--out", type=Path, help="folder for the runs (default reports/<time>-ray-scaling)")
    args = ap.parse_args()
    out = args.out or Path("reports") / f"{time.strftime('%Y%m%d-%H%M%S')}-ray-scaling"
    out.mkdir(parents=True, exist_ok=True)
    rows = [(n, measure(args, n, out)) for n in args.replicas]
    base = float(rows[0][1]["qps"])
    print(f"\n{'replicas':>8} {'ok/req':>8} {'mean ms':>9} {'p99 ms':>9} {'req/s':>8} {'ratio':>6}")
    for n, r in rows:
        print(f"{n:>8} {r['ok'] + '/' + r['requests']:>8} {float(r['mean_ms']):>9.1f} {float(r['p99_ms']):>9.1f} "
              f"{float(r['qps']):>8.2f} {float(r['qps']) / base:>5.2f}x")
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
