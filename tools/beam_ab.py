"""Two plans of the bounded engine's beam search in one process, their requests alternated:
the float plan and one with int8 GEMM groups (served with gate: accept), the same prompts,
the order flipped every request. On a shared, noisy machine this ratio is steadier than two
engines measured one after the other (a neighbour slows both alike).

    python tools/beam_ab.py                                    # W=100, 4 steps, 24-40 token prompts
    python tools/beam_ab.py --int8 gate_up,down --requests 30

Prints each plan's median request time and the ratio of the medians. The packages come
from the engine's cache (those `bench run scenarios/beam_short_int8.yaml` compiles). Run it
alone.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--width", type=int, default=100)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompt", default="24-40", help="prompt length range LO-HI (tokens)")
    ap.add_argument("--max-prompt", type=int, default=64)
    ap.add_argument("--int8", default="qkv,o,gate_up,down,head", help="comma-separated int8 groups")
    ap.add_argument("--requests", type=int, default=20, help="requests per plan")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.prompt.split("-"))

    from engines.base import BeamRequest, Bounds, EngineConfig
    from engines.bounded.engine import BoundedEngine
    from harness.workload.presets import resolve_model

    model_dir = Path(resolve_model(args.model, log=print))
    bounds = Bounds(max_samples_per_request=1, max_prompt_tokens=args.max_prompt,
                    max_beam_width=args.width, max_decode_steps=args.steps)
    plans = {"float": {}, "int8": {"int8": args.int8.split(","), "gate": "accept"}}
    engines = {name: BoundedEngine(EngineConfig(model_dir, "bfloat16", "cpu", bounds, "beam_search", options))
               for name, options in plans.items()}
    rng = random.Random(0)

    async def run() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {name: [] for name in engines}
        for i in range(args.requests + 1):  # the first round warms up
            prompt = [rng.randrange(1000, 100000) for _ in range(rng.randint(lo, hi))]
            order = list(engines.items())
            for name, engine in order if i % 2 else order[::-1]:
                t0 = time.perf_counter()
                await engine.submit(BeamRequest(f"{name}-{i}", prompt, args.width, args.steps))
                if i:
                    times[name].append((time.perf_counter() - t0) * 1000)
        return times

    try:
        for name, engine in engines.items():
            engine.start()
            print(f"{name}: {engine.describe().precision.summary}")
        times = asyncio.run(run())
    finally:
        for engine in engines.values():
            engine.stop()
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name}: median {median[name]:.1f} ms, min {min(t):.1f}, max {max(t):.1f} ({len(t)} requests)")
    print(f"float / int8: {median['float'] / median['int8']:.3f}x (ratio of the medians)")


if __name__ == "__main__":
    main()
