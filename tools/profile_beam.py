"""Kernel-by-kernel profile of the bounded engine's beam search, AOT packages included.

The packages are compiled with Inductor's `cpp.enable_kernel_profile` (engine option
kernel_profile: each generated kernel and extern call shows up in torch.profiler) into their
own cache (--cache, default /tmp/bounded-profile-cache). `bench profile` gives the same
breakdown by class for any scenario. Requests run on the
calling thread (the task's batch scope, as the engine's model thread runs it), two warm-up
requests first.

    python tools/profile_beam.py                           # bf16, W=100, 4 steps, 32-token prompts
    python tools/profile_beam.py --int8 qkv,o,gate_up,down,head

Run it alone: other processes on the cores make OpenMP barriers of small kernels look slow.
"""
from __future__ import annotations

import argparse
import os
import random
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--width", type=int, default=100)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=64)
    ap.add_argument("--int8", default="", help="comma-separated int8 groups (served with gate: accept)")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--rows", type=int, default=40, help="rows of the profile table")
    ap.add_argument("--cache", default="/tmp/bounded-profile-cache")
    args = ap.parse_args()
    os.environ["BOUNDED_BENCH_CACHE"] = args.cache  # before the engine reads it

    import torch

    from engines.base import Bounds, EngineConfig
    from engines.bounded.engine import BoundedEngine
    from engines.bounded.runtime.beam_batch import BeamJob
    from harness.workload.presets import resolve_model

    options = {"compile": "aot", "kernel_profile": True}  # its own packages: part of their key
    if args.int8:
        options.update(int8=args.int8.split(","), gate="accept")
    bounds = Bounds(max_samples_per_request=1, max_prompt_tokens=args.max_prompt,
                    max_beam_width=args.width, max_decode_steps=args.steps)
    model_dir = Path(resolve_model(args.model, log=print))
    engine = BoundedEngine(EngineConfig(model_dir, "bfloat16", "cpu", bounds, "beam_search", options))
    engine.start()
    task, rng = engine.tasks["beam_search"], random.Random(0)

    def request(i: int) -> None:
        prompt = [rng.randrange(1000, 100000) for _ in range(args.prompt)]
        task.run([BeamJob(prompt, args.width, args.steps, id=f"r{i}")], {})

    try:
        for i in range(2):
            request(-1 - i)
        with torch.profiler.profile() as prof:
            for i in range(args.requests):
                request(i)
        print(f"{args.requests} requests, precision {engine.describe().precision.summary}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows,
                                        max_name_column_width=70))
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
