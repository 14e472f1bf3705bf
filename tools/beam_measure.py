"""Measure the bounded engine's beam search without the harness's load generator:
requests/s, effective MFU (harness.flops, the report's formula) and memory across many
requests. The engine is built as `bench run` builds it for a beam scenario (bounds from the
flags), and is sent random token-id prompts one request at a time (or --concurrent at once,
which the engine batches into shared decode steps).

    python tools/beam_measure.py --model qwen2.5-0.5b --width 100 --steps 4 --prompt 32
    python tools/beam_measure.py --model qwen2.5-0.5b --width 400 --steps 5 --prompt 64 \\
        --requests 100 --memory   # resident memory must not grow after the first requests

Run it alone: other processes on the cores make the numbers meaningless.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

import torch

from engines.base import BeamRequest, Bounds, EngineConfig
from engines.bounded.engine import BoundedEngine
from harness.measure.flops import ModelShape, beam_flops
from harness.workload.presets import resolve_model


def rss_mb() -> float:
    """Anonymous resident memory (MiB): the process's own allocations. File-backed pages
    (the mapped packages, ~1 GB each) are left out: the kernel drops and re-reads them."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["RssAnon"].split()[0]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--width", type=int, default=100)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens of every request")
    ap.add_argument("--max-prompt", type=int, default=64, help="the bound max_prompt_tokens")
    ap.add_argument("--concurrent", type=int, default=1, help="requests sent together")
    ap.add_argument("--requests", type=int, default=5, help="measured rounds")
    ap.add_argument("--compile", default="aot", choices=("aot", "eager"))
    ap.add_argument("--peak-gflops", type=float, default=440.0)
    ap.add_argument("--memory", action="store_true", help="print resident memory after every round")
    args = ap.parse_args()

    model_dir = Path(resolve_model(args.model, log=print))
    bounds = Bounds(max_samples_per_request=1, max_prompt_tokens=args.max_prompt,
                    max_beam_width=args.width, max_decode_steps=args.steps)
    engine = BoundedEngine(EngineConfig(model_dir, args.dtype, "cpu", bounds, "beam_search",
                                        {"compile": args.compile}))
    engine.start()
    print(f"started in {engine.start_s:.1f} s; beam: {engine.describe().details['beam_search']['status']}")
    rng = random.Random(0)

    async def round_(i: int) -> list:
        reqs = [BeamRequest(f"r{i}-{j}", [rng.randrange(1000, 100000) for _ in range(args.prompt)],
                            args.width, args.steps) for j in range(args.concurrent)]
        return await asyncio.gather(*(engine.submit(r) for r in reqs))

    async def run() -> tuple[list[float], dict]:
        for i in range(2):  # warm-up
            await round_(-1 - i)
        rss0, times, stages = rss_mb(), [], {}
        for i in range(args.requests):
            t0, c0 = time.perf_counter(), time.process_time()
            results = await round_(i)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            stages = results[0].stages
            if args.memory:
                print(f"round {i}: {times[-1]:.3f} s, rss {rss_mb():.0f} MiB ({rss_mb() - rss0:+.0f})", flush=True)
        return times, stages

    cpu: list[float] = []  # CPU seconds of all the process's threads per round
    times, stages = asyncio.run(run())
    engine.stop()
    flops = args.concurrent * beam_flops(ModelShape.from_dir(model_dir), args.prompt, args.width, args.steps)
    mean = sum(times) / len(times)
    print(f"{args.model} {args.dtype} W={args.width} S={args.steps} P={args.prompt} x{args.concurrent} "
          f"compile={args.compile}: {mean:.3f} s per round (min {min(times):.3f}), "
          f"{args.concurrent / mean:.2f} requests/s, effective {flops / 1e9:.0f} GFLOP per round, "
          f"MFU {flops / mean / (args.peak_gflops * 1e9):.1%} (best round {flops / min(times) / (args.peak_gflops * 1e9):.1%}) "
          f"of {args.peak_gflops:.0f} GFLOP/s")
    cores = torch.get_num_threads()
    cpu_mean = sum(cpu) / len(cpu)
    print(f"CPU time {cpu_mean:.3f} s per round over {cores} threads: as if alone, "
          f"{cpu_mean / cores:.3f} s per round, MFU {flops / (cpu_mean / cores) / (args.peak_gflops * 1e9):.1%} "
          "(other processes on the cores stretch wall time, much less the CPU time)")
    print("last round's stages (ms):", {k: round(v, 1) for k, v in stages.items()})
    print(f"rss {rss_mb():.0f} MiB")


if __name__ == "__main__":
    main()
