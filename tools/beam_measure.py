"""Measure the bounded engine's beam search alone (no harness, no tokenizer): requests/s,
effective MFU (harness.flops, the report's formula) and memory across many requests.

    python tools/beam_measure.py --model qwen2.5-0.5b --width 100 --steps 4 --prompt 32
    python tools/beam_measure.py --model qwen2.5-0.5b --width 400 --steps 5 --prompt 64 \\
        --requests 100 --memory   # resident memory must not grow after the first requests

Run it alone: other processes on the cores make the numbers meaningless.
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from engines.bounded.beam_graphs import compile_graphs, eager_graphs
from engines.bounded.beam_programs import head_weight
from engines.bounded.beam_runtime import BeamJob, BeamPlan, BeamRunner
from engines.bounded.config import PrecisionPolicy
from engines.bounded.model import load_model
from engines.tokens import eos_ids
from harness.flops import ModelShape, beam_flops
from harness.presets import resolve_model


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
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1, help="requests per batch (beams share decode steps)")
    ap.add_argument("--requests", type=int, default=5, help="measured batches")
    ap.add_argument("--compile", default="aot", choices=("aot", "eager"))
    ap.add_argument("--peak-gflops", type=float, default=440.0)
    ap.add_argument("--memory", action="store_true", help="print resident memory after every batch")
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    model_dir = resolve_model(args.model, log=print)
    plan = BeamPlan(args.batch, args.width, args.steps, args.prompt)
    model = load_model(model_dir, PrecisionPolicy(args.dtype), max_positions=args.prompt + args.steps)
    graphs = eager_graphs(model)
    if args.compile == "aot":
        graphs, status = compile_graphs(model, model_dir, PrecisionPolicy(args.dtype), plan, [args.width], print)
    runner = BeamRunner(model.cfg, plan, graphs, head_weight(model), eos_ids(model_dir))
    print(f"planned beam buffers: {runner.buffers.nbytes() / 2**20:.0f} MiB; rss {rss_mb():.0f} MiB")
    rng = random.Random(0)

    def batch() -> list[BeamJob]:
        return [BeamJob([rng.randrange(1000, 100000) for _ in range(args.prompt)], args.width, args.steps)
                for _ in range(args.batch)]

    for _ in range(2):  # warm-up
        runner.run(batch())
    rss0 = rss_mb()
    times, stages = [], {}
    for i in range(args.requests):
        t0 = time.perf_counter()
        runner.run(batch(), stages)
        times.append(time.perf_counter() - t0)
        if args.memory:
            print(f"batch {i}: {times[-1]:.3f} s, rss {rss_mb():.0f} MiB (+{rss_mb() - rss0:.0f})")
    flops = args.batch * beam_flops(ModelShape.from_dir(model_dir), args.prompt, args.width, args.steps)
    mean = sum(times) / len(times)
    print(f"{args.model} {args.dtype} W={args.width} S={args.steps} P={args.prompt} batch={args.batch} "
          f"compile={args.compile}: {mean:.3f} s per batch (min {min(times):.3f}), "
          f"{args.batch / mean:.2f} requests/s, effective {flops / 1e9:.0f} GFLOP per batch, "
          f"MFU {flops / mean / (args.peak_gflops * 1e9):.1%} of {args.peak_gflops:.0f} GFLOP/s")
    print("last batch stages (ms):", {k: round(v, 1) for k, v in stages.items()})
    print(f"rss {rss_mb():.0f} MiB (+{rss_mb() - rss0:.0f} MiB over {args.requests} batches after warm-up)")


if __name__ == "__main__":
    main()
