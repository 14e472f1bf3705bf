"""The benchmark half of tools/gpu_check.sh: the smoke scenarios, prefill_15 and beam_short on
cuda with hf, bounded eager, bounded AOT and (bf16 scenarios) bounded AOT + FP8, then one
table: answers against hf, serving mode and fallback reason, mean/P99 per load point,
req/s, effective MFU.

    python tools/gpu_check.py --phase prepare --out DIR   # background: presets, then AOT compiles
    python tools/gpu_check.py --phase measure --out DIR --budget-s 400
    python tools/gpu_check.py --phase measure --out DIR --device cpu smoke_prefill   # the script itself, here

`prepare` returns at once: one background driver per model preset materialises it and
compiles that preset's AOT packages (`bench compile`, one process per variant), so the
compiles overlap the GPU tests; `measure` waits for them, then runs each scenario (nothing
else on the GPU) within the time left. Exit 1 if a check fails: an engine that did not
measure, a float32 scenario whose bounded answers are not hf's, or bounded AOT not agreeing
with bounded eager.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# scenario -> requests per load point
SCENARIOS = {"smoke_prefill": 8, "smoke_beam": 8, "prefill_15": 32, "beam_short": 32}
FP8_GROUPS = ["gate_up", "down"]  # the MLP: the largest GEMMs
# float32 scenarios must match hf closely; any scenario's AOT answers must match its eager ones
STRICT = {"prefill_max_abs_diff": 1e-3, "beam_overlap": 0.95}
SAME_ENGINE = {"prefill_max_abs_diff": 2e-2, "beam_overlap": 0.9}


def variants(scenario: dict) -> list[dict]:
    out = [{"name": "hf"}, {"name": "bounded", "label": "bounded-eager", "compile": "eager"},
           {"name": "bounded", "label": "bounded-aot", "compile": "aot"}]
    if scenario["dtype"] == "bfloat16":
        # the accuracy gate judges the fp8 plan (run.json holds its verdict); measured either way
        out.append({"name": "bounded", "label": "bounded-fp8", "compile": "aot", "fp8": FP8_GROUPS, "gate": "accept"})
    return out


def scenario_files(out: Path, names: list[str]) -> dict[str, dict[str, Path]]:
    """Per scenario: "all" (every variant, what is measured) and one file per AOT variant (what
    `bench compile` reads: its first bounded entry)."""
    files: dict[str, dict[str, Path]] = {}
    folder = out / "scenarios"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        sc = yaml.safe_load((REPO / "scenarios" / f"{name}.yaml").read_text())
        sc.pop("cpu", None)
        engines = variants(sc)
        files[name] = {"all": _write(folder / f"{name}.yaml", {**sc, "engines": engines})}
        for e in engines:
            if e.get("compile") == "aot":
                files[name][e["label"]] = _write(folder / f"{name}-{e['label']}.yaml", {**sc, "engines": [e]})
    return files


def _write(path: Path, content: dict) -> Path:
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def bench(*args: str, log: Path, timeout: float) -> int:
    cmd = [sys.executable, "-m", "harness.cli", *args]
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(timeout, 1), cwd=REPO).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n[gpu_check] stopped after {timeout:.0f} s\n")
            return 124


# --- prepare: presets and AOT packages, in the background ---------------------------------

def prepare(out: Path, names: list[str], device: str) -> None:
    files = scenario_files(out, names)
    by_model: dict[str, list[str]] = {}
    for name in names:
        by_model.setdefault(yaml.safe_load(files[name]["all"].read_text())["model"], []).append(name)
    jobs = []
    for model, names in by_model.items():
        log = out / f"prepare-{model}.log"
        p = subprocess.Popen([sys.executable, __file__, "--phase", "compile", "--out", str(out), "--model", model,
                              "--device", device, *names], stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO,
                             start_new_session=True)
        jobs.append({"model": model, "pid": p.pid, "log": str(log)})
    (out / "prepare.json").write_text(json.dumps(jobs))
    print(f"[gpu_check] preparing in the background: {', '.join(by_model)}")


def compile_for(out: Path, model: str, names: list[str], device: str) -> None:
    from harness.workload.presets import resolve_model

    t0 = time.time()
    resolve_model(model, print)
    print(f"preset {model} ready in {time.time() - t0:.0f} s", flush=True)
    files = scenario_files(out, names)
    procs = [subprocess.Popen([sys.executable, "-m", "harness.cli", "compile", str(path), "--device", device],
                              stdout=open(out / f"compile-{name}-{label}.log", "w"), stderr=subprocess.STDOUT,
                              cwd=REPO)
             for name in names for label, path in files[name].items() if label != "all"]
    for p in procs:
        p.wait()
    print(f"compiles done in {time.time() - t0:.0f} s: exit codes {[p.returncode for p in procs]}", flush=True)


def wait_prepared(out: Path, deadline: float) -> None:
    for job in json.loads((out / "prepare.json").read_text()):
        while _alive(job["pid"]) and time.time() < deadline:
            time.sleep(2)
        state = "still running (the run compiles what is missing)" if _alive(job["pid"]) else "done"
        print(f"[gpu_check] prepare {job['model']}: {state}; {Path(job['log']).read_text().strip().splitlines()[-1:]}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # reap it if it is our child's zombie
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


# --- measure ------------------------------------------------------------------------------

def measure(out: Path, names: list[str], device: str, budget_s: float) -> int:
    deadline = time.time() + budget_s
    files = scenario_files(out, names)
    if (out / "prepare.json").exists():
        wait_prepared(out, deadline - 60 * len(names))
    rows, failures = [], []
    for name in names:
        left = deadline - time.time()
        if left < 30:
            failures.append(f"{name}: not run (time budget spent)")
            continue
        run_dir = out / name
        rc = bench("run", str(files[name]["all"]), "--device", device, "--requests", str(SCENARIOS[name]),
                   "--out", str(run_dir), log=out / f"run-{name}.log", timeout=left - 10)
        if rc not in (0, 3) or not (run_dir / "run.json").exists():
            failures.append(f"{name}: bench run exit {rc} (see run-{name}.log)")
            continue
        r, f = judge(name, run_dir, rc)
        rows += r
        failures += f
    print_table(rows)
    (out / "summary.json").write_text(json.dumps({"rows": rows, "failures": failures}, indent=1, default=str))
    for line in failures:
        print(f"FAILED {line}")
    print("gpu_check: " + ("all checks passed" if not failures else f"{len(failures)} check(s) failed"))
    return 1 if failures else 0


def judge(name: str, run_dir: Path, rc: int) -> tuple[list[dict], list[str]]:
    from harness.measure.agreement import agreement
    from harness.report.rundir import load_run

    run = load_run(run_dir)
    strict = yaml.safe_load((run_dir.parent / "scenarios" / f"{name}.yaml").read_text())["dtype"] == "float32"
    rows, failures = [], []
    for e in run.run["engines"]:
        title, d = e["name"], e.get("describe") or {}
        vs_hf = agreement(run.outputs.get("hf", {}), run.outputs.get(title, {})) if title != "hf" else None
        vs_eager = agreement(run.outputs.get("bounded-eager", {}), run.outputs.get(title, {})) \
            if title in ("bounded-aot", "bounded-fp8") else None
        res = run.results[(run.results["engine"] == title) & (~run.results["probe"].astype(bool))]
        if e.get("skipped") or e.get("failed") or res.empty:
            failures.append(f"{name}/{title}: did not measure ({e.get('skipped') or e.get('failed') or 'no rows'})")
        for _, m in res.iterrows():
            rows.append({"scenario": name, "engine": title, "mode": d.get("mode", ""), "fallback": d.get("fallback"),
                         "load": f"{m['load_mode']} {m['load_value']:g}", "ok": f"{m['ok']}/{m['requests']}",
                         "mean_ms": m["mean_ms"], "p99_ms": m["p99_ms"], "qps": m["qps"], "mfu": m["mfu"],
                         "vs_hf": _short(vs_hf), "vs_eager": _short(vs_eager)})
        if strict and vs_hf and not _close(vs_hf, STRICT):
            failures.append(f"{name}/{title}: answers differ from hf's ({_short(vs_hf)})")
        if title == "bounded-aot" and vs_eager and not _close(vs_eager, SAME_ENGINE):
            failures.append(f"{name}/{title}: AOT answers differ from eager's ({_short(vs_eager)})")
    return rows, failures


def _close(a: dict, bound: dict) -> bool:
    if a["kind"] == "prefill_only":
        return a["max_abs_diff"] <= bound["prefill_max_abs_diff"]
    return a["mean_overlap"] >= bound["beam_overlap"]


def _short(a: dict | None) -> str:
    if not a:
        return ""
    if a["kind"] == "prefill_only":
        return f"max|dp| {a['max_abs_diff']:.2g}, top {a['top_label_match']:.0%}"
    return f"overlap {a['mean_overlap']:.0%}"


def print_table(rows: list[dict]) -> None:
    cols = ["scenario", "engine", "mode", "load", "ok", "mean_ms", "p99_ms", "qps", "mfu", "vs_hf", "vs_eager"]
    cells = [[_cell(c, r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    for reason in sorted({f"{r['engine']} ({r['scenario']}): {r['fallback']}" for r in rows if r["fallback"]}):
        print(f"fallback: {reason}")


def _cell(col: str, v) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else (f"{v:.1%}" if col == "mfu" else f"{v:.4g}")
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=("prepare", "measure", "compile"), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--device", default="cuda", help="cuda (the check), or cpu to try the script itself")
    ap.add_argument("--model", help="(compile phase) the preset whose packages to build")
    ap.add_argument("names", nargs="*", help=f"scenarios (default: {', '.join(SCENARIOS)})")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    names = a.names or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if a.phase == "prepare":
        prepare(a.out, names, a.device)
        return 0
    if a.phase == "compile":
        compile_for(a.out, a.model, names, a.device)
        return 0
    return measure(a.out, names, a.device, a.budget_s)


if __name__ == "__main__":
    sys.exit(main())
