"""Measure prefill-only scoring alone (no load generator): requests/s and effective MFU of
the bounded engine (and optionally the hf engine) on prefill_15-like requests, against a
bf16 matmul peak measured the same way, in wall time and in process CPU time (the CPU-time
figures stay meaningful when other processes share the cores; wall time does not).

    python tools/prefill_measure.py --model qwen3-0.6b --requests 6
    python tools/prefill_measure.py --model qwen3-0.6b --engines bounded hf --concurrency 2
    OMP_WAIT_POLICY=PASSIVE python tools/prefill_measure.py ...   # CPU time = work done

Effective FLOPs follow harness.flops (the report's formula).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import time

import torch

from engines.base import Bounds, EngineConfig, PrefillRequest
from engines.registry import create_engine
from harness.measure.flops import ModelShape, request_flops
from harness.workload.presets import resolve_model


def matmul_peak(n: int = 4096, reps: int = 3) -> tuple[float, float]:
    """Best bf16 n^3 mm rate: (wall GFLOP/s, CPU-time GFLOP/s x threads)."""
    a, b = torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, n, dtype=torch.bfloat16)
    torch.mm(a, b)
    wall = cpu = 0.0
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        wall = max(wall, 2 * n ** 3 / (time.perf_counter() - w) / 1e9)
        cpu = max(cpu, 2 * n ** 3 * torch.get_num_threads() / (time.process_time() - c) / 1e9)
    return wall, cpu


def make_requests(n: int, samples: int, lo: int, hi: int, seed: int) -> list[PrefillRequest]:
    rng = random.Random(seed)
    return [PrefillRequest(f"r{i}", [[rng.randrange(1000, 150000) for _ in range(rng.randint(lo, hi))]
                                     for _ in range(samples)], [" yes", " no"]) for i in range(n)]


async def drive(engine, requests, concurrency: int) -> None:
    queue = list(requests)

    async def client():
        while queue:
            await engine.submit(queue.pop(0))

    await asyncio.gather(*(client() for _ in range(concurrency)))


def measure(name: str, model_dir: str, args, requests) -> dict:
    bounds = Bounds(max_samples_per_request=16, max_prompt_tokens=512)
    engine = create_engine(name, EngineConfig(model_dir, args.dtype, "cpu", bounds, "prefill_only",
                                              {"compile": args.compile} if name == "bounded" else {}))
    t = time.perf_counter()
    engine.start()
    start_s = time.perf_counter() - t
    asyncio.run(drive(engine, requests[: args.warmup], 1))
    w, c = time.perf_counter(), time.process_time()
    asyncio.run(drive(engine, requests[args.warmup:], args.concurrency))
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    engine.stop()
    shape = ModelShape.from_dir(model_dir)
    flops = sum(request_flops(shape, [len(s) for s in r.samples]) for r in requests[args.warmup:])
    n = len(requests) - args.warmup
    return {"engine": name, "start_s": start_s, "req_s": n / wall, "gflops_wall": flops / wall / 1e9,
            "gflops_cpu": flops * torch.get_num_threads() / cpu / 1e9}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--compile", default="aot", choices=["aot", "eager"])
    p.add_argument("--engines", nargs="+", default=["bounded"])
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--tokens", type=int, nargs=2, default=(48, 160), metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    model_dir = resolve_model(args.model)
    requests = make_requests(args.requests + args.warmup, args.samples, *args.tokens, args.seed)
    before = matmul_peak()
    rows = [measure(name, model_dir, args, requests) for name in args.engines]
    after = matmul_peak()
    peak_wall, peak_cpu = max(before[0], after[0]), max(before[1], after[1])
    print(f"bf16 mm peak: {peak_wall:.0f} GFLOP/s wall, {peak_cpu:.0f} GFLOP/s CPU time "
          f"({torch.get_num_threads()} threads)")
    for r in rows:
        print(f"{r['engine']:8s} start {r['start_s']:5.1f} s  {r['req_s']:.3f} req/s  "
              f"effective {r['gflops_wall']:.0f} GFLOP/s = MFU {r['gflops_wall'] / peak_wall:.0%} (wall)  "
              f"{r['gflops_cpu']:.0f} GFLOP/s = {r['gflops_cpu'] / peak_cpu:.0%} (CPU time)")
    if len(rows) > 1:
        print(f"{rows[0]['engine']} / {rows[1]['engine']} requests/s: {rows[0]['req_s'] / rows[1]['req_s']:.2f}x")


if __name__ == "__main__":
    main()
