"""Peak dense rates of the device per precision, and the denominator of effective MFU.

On a CPU each precision's GEMM rate is measured (fp32 and bf16 with torch's matmul and,
for bf16, oneDNN's prepacked linear; fp16 only where the CPU has it natively; int8 with the
kernel the bounded engine's int8 GEMMs run on) at a few sizes, the presets' own GEMM shapes
among them, taking the best (~5 s, at the first `bench run`); the
result is cached per CPU (name and precision flags), torch version and thread count. On a
GPU the rates come from a table of dense (no sparsity) tensor-core figures; its fp32 rate is
the plain CUDA-core one (no TF32: no engine here enables it).

The MFU denominator is the device's best dense floating-point rate (a GPU: its bf16
tensor-core rate; a CPU: the highest measured float rate), the same for every engine, so an
engine computing in a dtype the device emulates reads low. The int8 rate is reported
beside it; int8 work counted at the same FLOPs may exceed 100 %.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, TypeVar

from engines.hardware import FLOAT_DTYPES, Capabilities, onednn_int8_exact, onednn_packs_bf16, probe
from harness.workload.presets import PRESETS, cache_root

PRECISIONS = (*FLOAT_DTYPES, "int8")
T = TypeVar("T")
VERSION = 3  # bump when what is measured changes: older cache entries are then remeasured

# dense TFLOP/s by substring of the device name: (bf16/fp16 tensor cores, fp32 without TF32)
GPU_TFLOPS = {
    "H200": (989.0, 67.0), "H100 SXM": (989.0, 67.0), "H100 PCIe": (756.0, 51.0), "H100 NVL": (835.0, 60.0),
    "H100": (989.0, 67.0), "H20": (148.0, 44.0), "B200": (2250.0, 80.0), "GB200": (2500.0, 80.0),
    "A100": (312.0, 19.5), "A800": (312.0, 19.5), "L40S": (362.0, 91.6), "L40": (181.0, 90.5),
    "L20": (119.5, 59.8), "L4": (121.0, 30.3), "A10G": (70.0, 31.2), "A10": (125.0, 31.2),
    "RTX 4090": (165.2, 82.6), "RTX 3090": (71.0, 35.6), "V100": (125.0, 15.7),
}


def gpu_rates(name: str, caps: Capabilities) -> dict[str, float] | None:
    """TFLOP/s per precision from the table (int8/fp8 at twice the bf16 rate where the
    tensor cores have them); None for a GPU the table does not know."""
    for key in sorted(GPU_TFLOPS, key=len, reverse=True):
        if key in name:
            half, fp32 = GPU_TFLOPS[key]
            rates = {"float32": fp32, "float16": half}
            if caps.native("bfloat16"):
                rates["bfloat16"] = half
            if caps.int8_isa:
                rates["int8"] = 2 * half
            if caps.fp8:
                rates["float8"] = 2 * half
            return rates
    return None


def gemm_shapes() -> dict[str, tuple[int, int, int]]:
    """(M, K, N) per label: a square, and the MLP GEMMs of the seed scenarios' presets
    (prefill_15: 15 samples x ~96 tokens of qwen3-0.6b; beam_short: 100 beams of qwen2.5-0.5b)."""
    out = {"2048 square": (2048, 2048, 2048)}
    for preset, rows, what in (("qwen3-0.6b", 1440, "1440 tokens"), ("qwen2.5-0.5b", 100, "100 beams")):
        h, i = PRESETS[preset]["hidden_size"], PRESETS[preset]["intermediate_size"]
        out[f"{preset} gate_up, {what}"] = (rows, h, 2 * i)
        out[f"{preset} down, {what}"] = (rows, i, h)
    return out


def _best_rate(fn: Callable[[], object], flops: float, seconds: float) -> float:
    """Best-of rate of `fn` (one warm-up call; at least 3 timed calls, then until `seconds`)."""
    fn()
    best, calls, end = 0.0, 0, time.perf_counter() + seconds
    while calls < 3 or time.perf_counter() < end:
        t = time.perf_counter()
        fn()
        best = max(best, flops / (time.perf_counter() - t))
        calls += 1
    return best / 1e12


def float_gemms(dtype: str, m: int, k: int, n: int) -> list[Callable[[], object]]:
    """y = x @ W.T with W stored [N, K], as the engines' linear layers hold it: aten's matmul,
    and for bf16 also oneDNN's linear on a prepacked weight (what the bounded engine's
    compiled graphs call; a few per cent faster here)."""
    import torch

    dt = getattr(torch, dtype)
    x, w = torch.randn(m, k, dtype=dt), torch.randn(n, k, dtype=dt)
    fns = [lambda: torch.mm(x, w.t())]
    if dtype == "bfloat16" and torch.backends.mkldnn.is_available() and onednn_packs_bf16():
        packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
        fns.append(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
    return fns


def int8_gemm(m: int, k: int, n: int) -> Callable[[], object]:
    return int8_linear(torch_randint8(m, k), torch_randint8(n, k))


def torch_randint8(*size: int):
    import torch

    return torch.randint(-127, 128, size, dtype=torch.int8)


def int8_linear(x, w) -> Callable[[], object]:
    """y = x @ w.T for int8 x [M, K], w [N, K], with the kernel the bounded engine's int8
    GEMMs compile to (engines/bounded/kernels/int8.py): oneDNN's int8 linear on a weight
    prepacked once, activations as u8 with zero point 128 (its VNNI/AMX path), int32
    accumulation, float32 out; `torch._int_mm` where oneDNN is not built in or would saturate
    (no VNNI or AMX: `onednn_int8_exact`)."""
    import torch

    if not torch.backends.mkldnn.is_available() or not onednn_int8_exact():  # without VNNI/AMX it saturates
        wt = w.t()
        return lambda: torch._int_mm(x, wt)
    xu = (x.to(torch.int16) + 128).to(torch.uint8)
    packed, w_scale = torch.ops.onednn.qlinear_prepack(w, None), torch.ones(w.shape[0])
    return lambda: torch.ops.onednn.qlinear_pointwise(xu, 1.0, 128, packed, w_scale, None, None, 1.0, 0,
                                                      torch.float32, "none", [], "")


def measure_cpu(caps: Capabilities, seconds: float = 0.25) -> dict[str, dict[str, float]]:
    """{precision: {shape label: TFLOP/s (int8: TOP/s)}}; fp16 only where native (an
    emulated fp16 GEMM on a CPU runs at ~1 GFLOP/s: minutes at these sizes); measured as
    the engine runs (_as_engine_runs)."""
    return _as_engine_runs(lambda: _measure_cpu(caps, seconds))


def _as_engine_runs(measure: Callable[[], T]) -> T:
    """`measure()` with malloc set as the bounded engine runs (engines/bounded/runtime/memory.py):
    otherwise each call's output over glibc's mmap threshold is mapped afresh and faulted in
    page by page, which is the kernel's time, not the GEMM's (an int8 [1,440, 1,024] x
    [1,024, 6,144] with its 35 MB float32 output read 1.2 TOP/s that way on a Xeon with AMX,
    ~4 held). On a thread of its own (engines/hardware.on_own_thread): a team of OpenMP
    threads left on the caller's thread would slow every engine the process runs after."""
    from engines.bounded.runtime import memory
    from engines.hardware import on_own_thread

    held = memory.keep_freed_memory()
    try:
        return on_own_thread(measure)
    finally:
        held.release()


def _measure_cpu(caps: Capabilities, seconds: float) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for prec in PRECISIONS:
        if prec == "float16" and not caps.native(prec):
            continue
        if prec == "int8" and caps.int8_isa is None:
            continue
        out[prec] = {}
        for label, (m, k, n) in gemm_shapes().items():
            fns = [int8_gemm(m, k, n)] if prec == "int8" else float_gemms(prec, m, k, n)
            out[prec][label] = max(_best_rate(fn, 2.0 * m * k * n, seconds) for fn in fns)
    return out


SPOT_SHAPE = "2048 square"  # the cached shape a run measures again at its start and end
SLOW_HOST = 0.85  # a host check under this share of the cached rate is reported


def spot_rate(caps: Capabilities, dtype: str, seconds: float = 0.2) -> float:
    """TFLOP/s of the SPOT_SHAPE GEMM of `dtype` on this host now: the best of ~`seconds` of
    calls, measured as the cached rates are (_as_engine_runs)."""
    m, k, n = gemm_shapes()[SPOT_SHAPE]
    return _as_engine_runs(lambda: max(_best_rate(fn, 2.0 * m * k * n, seconds) for fn in float_gemms(dtype, m, k, n)))


@dataclass(frozen=True)
class Peaks:
    """The device's dense rates per precision (TFLOP/s; int8 TOP/s) and the MFU denominator."""

    device: str
    capabilities: Capabilities
    rates: dict[str, float]  # best over the sizes
    source: str  # how the rates were obtained
    by_shape: dict[str, dict[str, float]] = field(default_factory=dict)  # measured: per size
    override: float | None = None  # --peak-tflops
    checks: tuple[tuple[str, float], ...] = ()  # (when, TFLOP/s): the SPOT_SHAPE GEMM measured again

    def checked(self, when: str, measure: Callable[[Capabilities, str], float] | None = None) -> "Peaks":
        """These peaks with the host's rate on the cached SPOT_SHAPE GEMM of the MFU precision
        measured again now (`when`: "start", "end"); unchanged on a GPU, under --peak-tflops, or
        without that cached rate. A shared machine's rates move within a day (a bf16 2,048²
        GEMM read 2.49 and 1.87 TFLOP/s on one Xeon on one day): a run says when its host was
        slower than the cached peak, where every engine's MFU reads low."""
        if self.capabilities.device_type != "cpu" or self.override is not None or self.cached_spot() is None:
            return self
        rate = (measure or spot_rate)(self.capabilities, self.mfu_precision)
        return replace(self, checks=(*self.checks, (when, rate)))

    def cached_spot(self) -> float | None:
        return self.by_shape.get(self.mfu_precision, {}).get(SPOT_SHAPE)

    def slow_host(self) -> list[str]:
        """A warning when a host check read under SLOW_HOST of the cached rate."""
        cached = self.cached_spot()
        slow = [(when, rate) for when, rate in self.checks if cached and rate < SLOW_HOST * cached]
        if not slow:
            return []
        when, rate = min(slow, key=lambda c: c[1])
        return [f"this host ran the {self.mfu_precision} {SPOT_SHAPE} GEMM at {rate / cached:.0%} of its cached rate "
                f"at the run's {when} ({rate * 1e3:,.0f} vs {cached * 1e3:,.0f} GFLOP/s, {self.source.split(',')[0]}): "
                f"a busy or throttled machine, where every engine's times read slow and its MFU low; compare "
                f"engines within this run, not with a run on a quieter host"]

    @property
    def mfu_precision(self) -> str:
        """The float dtype whose rate is the MFU denominator."""
        if self.capabilities.device_type == "cuda" and "bfloat16" in self.rates:
            return "bfloat16"
        floats = {d: r for d, r in self.rates.items() if d in FLOAT_DTYPES}
        return max(floats, key=floats.get) if floats else "float32"

    @property
    def mfu_tflops(self) -> float:
        return self.override if self.override is not None else self.rates.get(self.mfu_precision, float("nan"))

    def why(self) -> str:
        if self.override is not None:
            return "given on the command line (--peak-tflops)"
        if self.capabilities.device_type == "cuda":
            return f"the {self.mfu_precision} tensor-core rate ({self.source})"
        rates = ", ".join(f"{d} {r * 1e3:.0f}" for d, r in self.rates.items() if d in FLOAT_DTYPES)
        return f"the best measured float rate: {self.mfu_precision} (GFLOP/s: {rates}; {self.source})"

    def emulated(self, dtype: str) -> str | None:
        """Why the device emulates `dtype` (no native instructions, and no faster than
        another float dtype), naming the faster one; None when it runs `dtype` natively."""
        if dtype not in FLOAT_DTYPES or self.capabilities.native(dtype):
            return None
        faster = self.mfu_precision if self.mfu_precision != dtype else "float32"
        mine, theirs = self.rates.get(dtype), self.rates.get(faster)
        if mine is not None and theirs is not None and mine >= theirs:
            return None
        what = "no AVX512-BF16/AMX-BF16" if dtype == "bfloat16" else "no AVX512-FP16/AMX-FP16"
        if self.capabilities.device_type == "cuda":
            what = f"compute capability {self.capabilities.facts()['compute_capability']}"
        speed = f" ({mine * 1e3:.0f} GFLOP/s)" if mine is not None else ""
        tail = f" at {theirs * 1e3:.0f} GFLOP/s" if theirs is not None else ""
        return f"{self.capabilities.name} has {what}{speed}; {faster} runs natively{tail}"

    def to_json(self) -> dict[str, object]:
        cached = self.cached_spot()
        return {"tflops": self.mfu_tflops, "precision": self.mfu_precision, "why": self.why(),
                "source": self.source, "rates_tflops": dict(self.rates), "by_shape": self.by_shape,
                "host_checks": [{"when": when, "shape": SPOT_SHAPE, "tflops": rate,
                                 "of_cached": rate / cached if cached else None} for when, rate in self.checks],
                "capabilities": self.capabilities.facts()}


def cache_key(caps: Capabilities) -> str:
    import torch

    return f"v{VERSION}|{caps.name}|{caps.key()}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def _read_cache(path) -> dict:
    """The measurements cached in `path` ({} when it is missing or unreadable: remeasured)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_cached(caps: Capabilities) -> bool:
    """Were this CPU's rates measured before (with this torch and thread count)?"""
    return cache_key(caps) in _read_cache(cache_root() / "peaks.json")


def cpu_peaks(caps: Capabilities, refresh: bool = False,
              measure: Callable[[Capabilities], dict[str, dict[str, float]]] | None = None) -> Peaks:
    """Measured rates, cached in `peaks.json` under the cache root."""
    key, path = cache_key(caps), cache_root() / "peaks.json"
    cache = _read_cache(path)
    if key not in cache or refresh:
        by_shape = (measure or measure_cpu)(caps)
        cache[key] = {"by_shape": by_shape, "measured": time.strftime("%Y-%m-%d %H:%M")}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    entry = cache[key]
    by_shape = entry["by_shape"]
    rates = {p: max(r.values()) for p, r in by_shape.items() if r}
    src = f"measured {entry['measured']}, best of {len(gemm_shapes())} GEMM sizes, cached in {path}"
    return Peaks("cpu", caps, rates, src, by_shape)


def device_peaks(device: str, refresh: bool = False, caps: Capabilities | None = None,
                 override: float | None = None) -> Peaks:
    """The peaks of `device`; `override` (TFLOP/s) replaces the MFU denominator and skips measuring."""
    caps = caps or probe(device)
    if override is not None:
        return Peaks(caps.device_type, caps, {}, "not measured", override=override)
    if caps.device_type == "cuda":
        rates = gpu_rates(caps.name, caps)
        if rates is None:
            raise ValueError(f"no peak known for GPU {caps.name!r}; pass --peak-tflops")
        return Peaks("cuda", caps, rates, f"table: {caps.name}, dense, no sparsity")
    return cpu_peaks(caps, refresh)
