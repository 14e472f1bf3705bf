"""run.json: everything needed to know what was measured and how."""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import harness
from harness.measure.flops import FORMULA
from harness.report.tables import result_rows


def git_sha() -> str:
    try:
        root = Path(harness.__file__).resolve().parent.parent
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        env["threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return env


def provenance(result: Any, context: dict) -> dict[str, Any]:
    sc = result.scenario
    text = context.get("scenario_text") or sc.model_dump_json()
    return {
        "harness": {"version": harness.__version__, "git_sha": git_sha()},
        "command": context.get("command", sys.argv),
        "run_id": context.get("run_id"),
        "scenario": {"path": context.get("scenario_path"), "sha256": hashlib.sha256(text.encode()).hexdigest(),
                     "content": sc.model_dump(mode="json"), "text": text},
        "seed": sc.workload.seed,
        "model_dir": result.model_dir,
        "device": result.device,
        "peak": result.peaks.to_json(),
        "hardware": result.peaks.capabilities.facts(),
        "mfu_formula": FORMULA,
        "environment": environment(),
        "engines": [{"name": er.name, "describe": er.describe.to_dict() if er.describe else {}, "start_s": er.start_s, "starts": er.starts,
                     "skipped": er.skipped, "failed": er.failed, "unconstrained": not er.constrained,
                      "optional": er.optional}
                    for er in result.engines],
        "sweep": {"params": result.swept, "sizing": result.plan.sizing,
                  "cells": [{"label": c.label, "params": c.params, "bounds": asdict(c.bounds)}
                            for c in result.plan.cells]},
        "slo": sc.slo.model_dump(),
        # one search per engine (unswept runs, as before) and one per engine and cell
        "slo_search": {er.name: s.summary() for er in result.engines for c, s in er.searches if not result.swept},
        "slo_searches": [{"engine": er.name, "cell": c.label, "params": c.values(), **s.summary()}
                         for er in result.engines for c, s in er.searches],
        "notes": result.notes,
        "warnings": result.warnings,
        "interrupted": result.interrupted,
        "results": result_rows(result),
    }


def write_run_json(result: Any, out_dir: Path, context: dict) -> Path:
    path = out_dir / "run.json"
    path.write_text(json.dumps(provenance(result, context), indent=2, default=str, allow_nan=True))
    return path
