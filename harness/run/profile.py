"""`bench profile`: where a request's time goes, by class, for one in-process engine.

The engine starts as a scenario's entry would (the bounded engine with option
kernel_profile, so each compiled kernel shows in torch.profiler: its packages are cached
apart from the served ones), answers the scenario's warm-up requests, then N requests one
at a time under torch.profiler (CPU; CUDA activity too on a GPU). The events become classes
(measure/profile.py); each class gets its floor: the GEMMs' FLOPs at the rate oneDNN (or
cuBLAS) reaches on the same shapes alone (an int8 group's: its int8 kernel's), attention's
FLOPs at the device's measured peak, norms/elementwise and head + selection bytes at the
measured copy bandwidth.
Writes profile.json, profile.csv and profile.html into the output folder.
"""
from __future__ import annotations

import asyncio
import csv
import json
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from engines.base import BeamRequest
from engines.hardware import onednn_packs_bf16
from engines.registry import create_engine
from harness.device.peak import device_peaks
from harness.measure.flops import ModelShape, model_shape
from harness.measure.profile import CLASSES, LABELS, ClassRow, class_times, host_parts
from harness.scenario.engines import engine_config, select_engines
from harness.scenario.schema import Scenario
from harness.workload.presets import resolve_model
from harness.workload.requests import build_workload, load_tokenizer


IN_PROCESS = ("bounded", "hf")


class ProfileError(ValueError):
    pass


@dataclass
class Profile:
    scenario: str
    engine: str
    device: str
    requests: int
    request_ms: float  # mean wall time of a request, submit to answer
    rows: list[ClassRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "engine": self.engine, "device": self.device, "requests": self.requests,
                "request_ms": self.request_ms, "classes": [asdict(r) for r in self.rows], "notes": self.notes}


def profile_scenario(scenario: Scenario, engine_name: str, requests: int, device: str,
                     log: Callable[[str], None] = print, base_dir: Path | None = None) -> Profile:
    import torch

    spec = select_engines(scenario, [engine_name])[0]
    if spec.name not in IN_PROCESS:
        raise ProfileError(f"--engine {engine_name}: bench profile needs an in-process engine ({', '.join(IN_PROCESS)}); "
                           f"{spec.name} answers from a server process the profiler does not see")
    model_dir = resolve_model(scenario.model, log=log)
    shape = model_shape(model_dir)
    workload = build_workload(scenario, load_tokenizer(model_dir), base_dir)
    config = engine_config(scenario, spec, model_dir, device)
    if spec.name == "bounded":  # every compiled kernel visible to the profiler
        config = replace(config, options={**config.options, "kernel_profile": True})
    engine = create_engine(spec.name, config)
    log(f"starting {spec.title} (kernel-profiling packages compile once, cached apart from the served ones) ...")
    engine.start()
    try:
        warm = max(2, getattr(scenario.load, "warmup_requests", 0) or 0)
        items = [workload[i] for i in range(warm + requests)]
        asyncio.run(_answer(engine, [it.request for it in items[:warm]]))
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        log(f"profiling {requests} requests, one at a time ...")
        # the engine's model thread is not this one: record every thread's events
        threads = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        with torch.profiler.profile(activities=activities, experimental_config=threads) as prof:
            walls, stages = asyncio.run(_answer(engine, [it.request for it in items[warm:]]))
        dtype = engine.describe().precision.dtype
        policy = getattr(engine, "policy", None)  # the bounded engine's: the GEMM kind of each layer group
        kinds = {g: policy.gemm_kind(g) for g in ("qkv", "o", "gate_up", "down")} if policy is not None else {}
    finally:
        engine.stop()
    peak = device_peaks(device).checked("end")  # a note when the host ran slower than its cached peak
    events = prof.events()
    fused_head = any(FUSED_HEAD in e.name for e in events)
    work = _work(shape, items[warm:], dtype, peak.rates.get(dtype, peak.mfu_tflops), fused_head, kinds)
    out = _profile(scenario.name, spec.title, device, events, walls, stages, work)
    out.notes += peak.slow_host()
    return out


async def _answer(engine, reqs) -> tuple[list[float], list[dict[str, float]]]:
    walls, stages = [], []
    for req in reqs:
        t0 = time.perf_counter()
        result = await engine.submit(req)
        walls.append((time.perf_counter() - t0) * 1000.0)
        stages.append(dict(getattr(result, "stages", None) or {}))
    return walls, stages


def _profile(scenario: str, title: str, device: str, events, walls: list[float], stages: list[dict[str, float]],
             work: dict[str, tuple[str, float, float]]) -> Profile:
    """The classes of the profiled requests: kernel time per class from the events, the rest
    of the mean request time as host time, split by the engine's stage times."""
    n = len(walls)
    request_ms = sum(walls) / n
    times = class_times(events)
    per = {c: us / 1000.0 / n for c, us in times.classes.items()}
    measured = sum(per.values())
    notes = []
    if measured > request_ms * 1.02:  # kernels on several threads at once (e.g. a server's pool)
        notes.append(f"kernel time {measured:.1f} ms exceeds the request's {request_ms:.1f} ms: "
                     "work ran on several threads at once; shares are of the summed time")
    host = max(0.0, request_ms - measured)
    mean_stages = {k: statistics.fmean(s.get(k, 0.0) for s in stages) for k in ("tokenize", "queue", "pack")}
    rows = []
    total = max(request_ms, measured)
    for c in CLASSES[:-1]:
        rows.append(_row(c, per[c], total, work.get(c)))
    rows.append(ClassRow("host", round(host, 3), round(host / total, 4)))
    parts = host_parts(host, mean_stages, times.graph_gaps / 1000.0 / n)
    rows += [ClassRow(f"host: {name}", round(ms, 3), round(ms / total, 4)) for name, ms in parts]
    return Profile(scenario, title, device, n, round(request_ms, 3), rows, notes)


def _row(cls: str, ms: float, total: float, work: tuple[str, float, float] | None) -> ClassRow:
    """work: (words, amount, floor_ms) for the class."""
    if work is None:
        return ClassRow(cls, round(ms, 3), round(ms / total, 4) if total else 0.0)
    words, amount, floor = work
    unit = "GFLOP/s" if "FLOP" in words else "GB/s"
    rate = f"{amount / (ms / 1000.0) / 1e9:,.0f} {unit}" if ms > 0 and amount else ""
    return ClassRow(cls, round(ms, 3), round(ms / total, 4) if total else 0.0, words, rate,
                    round(floor, 3) if amount else None)


FUSED_HEAD = "head_gemm_summary"  # the native fused beam head ran: no logits written


def _work(shape: ModelShape, items, dtype: str, peak_tflops: float, fused_head: bool = False,
          kinds: dict[str, str] | None = None) -> dict[str, tuple[str, float, float]]:
    """Per request: {class: (the work in words, its amount, its floor in ms)}. `fused_head`:
    the beam head's softmax statistics ran inside its GEMM, and the choice recomputes only
    the candidate blocks' logits (k x 128 per row group): no logits are read back, and none
    are written, so the head GEMM's floor is its FLOPs at the peak rate or its weight read at
    the measured bandwidth, whichever is longer (a library GEMM of its shape writes [rows, V]
    logits: at hidden 64 that write alone took longer than the whole fused head). `kinds`:
    the GEMM kind of each layer group (qkv, o, gate_up, down; dense where absent): an int8
    group's floor is at the int8 kernel's rate on its shape."""
    import torch

    beam = isinstance(items[0].request, BeamRequest)
    calls = _gemm_calls(shape, items, beam)
    n = len(items)
    elt = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    gemm = sum(2 * m * k * o * times for (m, k, o), times in calls.items()) / n
    kind = _kind_by_weight(shape, kinds or {})
    bandwidth = _bandwidth()
    fused = {mko: t for mko, t in calls.items() if fused_head and beam and mko[1:] == (shape.hidden, shape.vocab)}
    floor = sum(flops / _isolated_rate(m, k, o, dtype, kind.get((k, o), "dense"))
                for (m, k, o), flops in _by_shape({c: t for c, t in calls.items() if c not in fused}).items())
    floor += sum(t * max(2.0 * m * k * o / (peak_tflops * 1e12), k * o * elt / bandwidth)
                 for (m, k, o), t in fused.items())
    floor = floor / n * 1000.0
    attn = sum(_attention_flops(shape, it, beam) for it in items) / n
    rows = sum(_rows(it, beam) for it in items) / n  # token rows through the layers
    h, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    elementwise = shape.layers * rows * (10 * h + 2 * (q + kv) + 3 * i) * elt
    head_rows = sum(_head_rows(it, beam) for it in items) / n
    head = 2 * head_rows * shape.vocab * elt if beam and not fused_head else 0.0
    out = {"gemm": (f"{gemm / 1e9:,.2f} GFLOP", gemm, floor),
           "attention": (f"{attn / 1e9:,.2f} GFLOP", attn, attn / (peak_tflops * 1e12) * 1000.0),
           "norms_elementwise": (f"{elementwise / 1e6:,.1f} MB (estimate)", elementwise,
                                 elementwise / bandwidth * 1000.0)}
    if head:
        out["head_selection"] = (f"{head / 1e6:,.1f} MB (logits read twice)", head, head / bandwidth * 1000.0)
    elif beam:
        out["head_selection"] = ("no logits written (fused head)", 0.0, 0.0)
    return out


def _gemm_calls(shape: ModelShape, items, beam: bool) -> dict[tuple[int, int, int], int]:
    """{(rows, in, out): calls} of every GEMM of the requests (a layer's four, the head)."""
    h, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    calls: dict[tuple[int, int, int], int] = {}

    def add(m: int, times: int = 1, head: int = 0) -> None:
        for k, o in ((h, q + 2 * kv), (q, h), (h, 2 * i), (i, h)):
            calls[(m, k, o)] = calls.get((m, k, o), 0) + shape.layers * times
        if head:
            calls[(head, h, shape.vocab)] = calls.get((head, h, shape.vocab), 0) + times

    for it in items:
        if beam:
            r = it.request
            add(it.prompt_tokens[0], head=1)
            add(r.beam_width, r.decode_steps - 1, head=r.beam_width)
        else:
            add(sum(it.prompt_tokens))
    return calls


def _kind_by_weight(shape: ModelShape, kinds: dict[str, str]) -> dict[tuple[int, int], str]:
    """{(in, out): GEMM kind} of a layer's four weights (two groups of one shape: the first's)."""
    h, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    out: dict[tuple[int, int], str] = {}
    for group, ko in (("qkv", (h, q + 2 * kv)), ("o", (q, h)), ("gate_up", (h, 2 * i)), ("down", (i, h))):
        out.setdefault(ko, kinds.get(group, "dense"))
    return out


def _rows(item, beam: bool) -> int:
    r = item.request
    return item.prompt_tokens[0] + r.beam_width * (r.decode_steps - 1) if beam else sum(item.prompt_tokens)


def _head_rows(item, beam: bool) -> int:
    r = item.request
    return 1 + r.beam_width * (r.decode_steps - 1) if beam else 0


def _attention_flops(shape: ModelShape, item, beam: bool) -> int:
    per = shape.attn_flops_per_context
    if beam:
        r, p = item.request, item.prompt_tokens[0]
        return per * (p * (p + 1) // 2 + r.beam_width * sum(p + k for k in range(1, r.decode_steps)))
    return sum(per * n * (n + 1) // 2 for n in item.prompt_tokens)


def _by_shape(calls: dict[tuple[int, int, int], int]) -> dict[tuple[int, int, int], float]:
    """{(typical rows, in, out): FLOPs} per weight shape, the rows FLOP-weighted (one
    measurement per weight, not one per row count a request happened to have)."""
    flops: dict[tuple[int, int], float] = {}
    rows: dict[tuple[int, int], float] = {}
    for (m, k, o), times in calls.items():
        f = 2.0 * m * k * o * times
        flops[(k, o)] = flops.get((k, o), 0.0) + f
        rows[(k, o)] = rows.get((k, o), 0.0) + m * f
    return {(max(1, round(rows[ko] / flops[ko])), *ko): f for ko, f in flops.items()}


_ISOLATED: dict[tuple[int, int, int, str, str], float] = {}


def _isolated_rate(m: int, k: int, o: int, dtype: str, kind: str = "dense") -> float:
    """FLOP/s of one [m, k] x [k, o] GEMM alone, as the engines run it: oneDNN with the
    weight prepacked in bf16/fp16 (what Inductor's freezing lowers to), F.linear in float32;
    an int8 group's (kernels/int8.py) oneDNN's u8 x s8 kernel on a prepacked weight, writing
    `dtype`; the best of ~0.2 s of calls, measured once per shape."""
    import torch
    import torch.nn.functional as F

    from engines.bounded.kernels import int8

    key = (m, k, o, dtype, kind)
    if key in _ISOLATED:
        return _ISOLATED[key]
    dt = getattr(torch, dtype)
    x, w = torch.randn(m, k, dtype=dt), torch.randn(o, k, dtype=dt)
    packed_int8 = int8.prepack(int8.int8_quantise(w)[0]) if kind == "int8" else None
    with torch.inference_mode():
        if packed_int8 is not None:
            xq, scale = torch.randint(0, 255, (m, k), dtype=torch.uint8), torch.ones(o)
            call = lambda: torch.ops.onednn.qlinear_pointwise(  # noqa: E731
                xq, 1.0, int8.ZERO, packed_int8, scale, None, None, 1.0, 0, dt, "none", [], "")
        elif dt != torch.float32 and torch.backends.mkldnn.is_available() and onednn_packs_bf16():
            packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
            call = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")  # noqa: E731
        else:
            call = lambda: F.linear(x, w)  # noqa: E731
        call()
        best, spent, t_end = float("inf"), 0, time.perf_counter() + 0.2
        while time.perf_counter() < t_end or spent < 3:
            t0 = time.perf_counter()
            call()
            best, spent = min(best, time.perf_counter() - t0), spent + 1
    _ISOLATED[key] = 2.0 * m * k * o / best
    return _ISOLATED[key]


def _bandwidth() -> float:
    """Bytes/s of a large copy (read + write), best of a few."""
    import torch

    src = torch.ones(64 << 20, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def write(profile: Profile, out: Path) -> list[Path]:
    """profile.json, profile.csv and profile.html into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(profile.to_json(), indent=2) + "\n")
    with open(out / "profile.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["class", "ms_per_request", "share", "work", "rate", "floor_ms"])
        for r in profile.rows:
            w.writerow([r.name, r.ms, r.share, r.work, r.rate, "" if r.floor_ms is None else r.floor_ms])
    (out / "profile.html").write_text(render_html(profile))
    return [out / "profile.json", out / "profile.csv", out / "profile.html"]


def render_html(profile: Profile) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("harness.report", "templates"), autoescape=True)
    return env.get_template("profile.html.j2").render(p=profile, label=label)


def label(name: str) -> str:
    if name.startswith("host: "):
        return "  · " + name[len("host: "):]
    return LABELS.get(name, name)
