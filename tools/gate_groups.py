"""The accuracy gate's verdict on each int8 group set, one engine start per set: how far
each plan is from the engine's float32 path on the gate's calibration batch, beside bf16's.

    python tools/gate_groups.py prefill_only qkv o gate_up down qkv,gate_up
    python tools/gate_groups.py beam_search gate_up,down qkv,o,gate_up,down,head

Each argument after the task is one plan (comma-separated groups). `--compile eager` (the
default) judges the quantisation itself (int8 values dequantised into a float32 GEMM, the
numbers the oneDNN kernel computes) without compiling a package per plan; `aot` judges the
packages as served. Verdicts are cached like the engine's (tasks/gate.py).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from engines.base import Bounds, EngineConfig
from engines.bounded.engine import BoundedEngine
from harness.workload.presets import resolve_model

BOUNDS = {"prefill_only": Bounds(max_samples_per_request=16, max_prompt_tokens=512),
          "beam_search": Bounds(max_samples_per_request=1, max_prompt_tokens=64, max_beam_width=100,
                                max_decode_steps=4)}
MODELS = {"prefill_only": "qwen3-0.6b", "beam_search": "qwen2.5-0.5b"}  # prefill_15's, beam_short's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", choices=sorted(BOUNDS))
    ap.add_argument("plans", nargs="+", help="comma-separated int8 groups, one plan per argument")
    ap.add_argument("--model", help="preset (default: the task's scenario model)")
    ap.add_argument("--compile", default="eager", choices=("eager", "aot"))
    args = ap.parse_args()
    model_dir = Path(resolve_model(args.model or MODELS[args.task], log=print))
    for plan in args.plans:
        options = {"compile": args.compile, "int8": plan.split(","), "gate": "accept"}
        engine = BoundedEngine(EngineConfig(model_dir, "bfloat16", "cpu", BOUNDS[args.task], args.task, options))
        engine.start()
        try:
            g = engine.gates[args.task]
            print(json.dumps({"int8": plan.split(","), "plan_vs_float32": g["plan_vs_float32"],
                              "bfloat16_vs_float32": g["bfloat16_vs_float32"]}), flush=True)
        finally:
            engine.stop()


if __name__ == "__main__":
    main()
