"""`bench doctor`: what this machine has and which engines can run on it."""
from __future__ import annotations

import importlib.metadata as md
import platform
import statistics
import time
from pathlib import Path
from typing import Iterator

from engines.base import EngineConfig, EngineUnavailable
from engines.registry import ENGINES, engine_class
import harness
from harness.workload.presets import cache_root
from engines import toolchain
from engines.hardware import FLOAT_DTYPES, probe
from harness.device.peak import PRECISIONS, SPOT_SHAPE, cpu_peaks, device_peaks, is_cached


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


def report(measure: bool = False) -> Iterator[tuple[str, str]]:
    yield "bounded-bench", harness.__version__
    yield "python", platform.python_version()
    for pkg in ("torch", "transformers", "pydantic", "httpx"):
        yield pkg, _version(pkg)
    import torch

    yield "torch threads", str(torch.get_num_threads())
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        yield from device_lines(device, measure)
    hot, idle = idle_memory()
    yield "cpu idle memory", idle_memory_line(hot, idle, huge_idle_ms=idle_memory(huge=True)[1])
    if not torch.cuda.is_available():
        yield "gpu", "none"
    yield "cache", str(cache_root())
    for device in ("cpu", *(["cuda"] if torch.cuda.is_available() else [])):
        yield from toolchain_lines(device)
    for name in ENGINES:
        yield f"engine {name}", _engine_status(name)


def toolchain_lines(device: str) -> Iterator[tuple[str, str]]:
    """What AOTInductor needs to compile packages for `device`, each found or missing (and how
    to provide it); without them the bounded engine serves eagerly and says why."""

    for c in toolchain.check(device):
        yield f"aot {device} {c.name}", ("ok: " if c.ok else "MISSING: ") + c.detail


def device_lines(device: str, measure: bool, caps=None) -> Iterator[tuple[str, str]]:
    """The ISA facts that decide precision, and every rate per precision (measured on a CPU
    only with --measure or when a run measured them before; a table on a GPU)."""

    caps = caps or probe(device)
    facts = caps.facts()
    yield device, caps.name
    if caps.device_type == "cuda":
        yield f"{device} isa", f"compute capability {facts['compute_capability']}"
    else:
        yield f"{device} isa", ", ".join(f"{f} {'yes' if f in caps.flags else 'no'}" for f in _SHOWN_FLAGS)
    native = ", ".join(d for d, ok in facts["native"].items() if ok)
    yield f"{device} native", f"{native}; int8: {caps.int8_isa or 'none'}; fp8: {'yes' if caps.fp8 else 'no'}"
    if caps.device_type == "cpu" and not (measure or is_cached(caps)):
        yield f"{device} peak", "not measured yet (bench doctor --measure, or the first bench run)"
        return
    try:
        peaks = cpu_peaks(caps, refresh=measure) if caps.device_type == "cpu" else device_peaks(device, caps=caps)
    except ValueError as e:  # a GPU the table does not know
        yield f"{device} peak", str(e)
        return
    for prec in (*PRECISIONS, "float8"):
        if prec in peaks.rates:
            unit = "GOP/s" if prec in ("int8", "float8") else "GFLOP/s"
            mark = "  <- MFU denominator" if prec == peaks.mfu_precision else ""
            mark += " (emulated)" if prec in FLOAT_DTYPES and not caps.native(prec) else ""
            yield f"{device} {prec}", f"{peaks.rates[prec] * 1e3:,.0f} {unit}{mark}"
        elif prec != "float8":
            yield f"{device} {prec}", "not native here, not measured" if prec == "float16" else "none"
    yield f"{device} peak", peaks.source
    if caps.device_type == "cpu" and not measure and peaks.cached_spot() is not None:
        yield f"{device} now", host_now_line(peaks.checked("now"))


def host_now_line(peaks) -> str:
    """The cached SPOT_SHAPE rate measured again now (Peaks.checked), against the cached one."""
    rate, cached = peaks.checks[-1][1], peaks.cached_spot()
    line = f"{peaks.mfu_precision} {SPOT_SHAPE} GEMM {rate * 1e3:,.0f} GFLOP/s, {rate / cached:.0%} of the cached rate"
    if peaks.slow_host():
        line += ": busy or throttled now, so runs read slow and MFU low (refresh the peak on a quiet machine only)"
    return line


IDLE_MIB = 16
IDLE_GAP_S = 0.5
IDLE_SLOW = 3.0  # after the gap, this many times slower: say it is the machine's


def idle_memory(mib: int = IDLE_MIB, gap_s: float = IDLE_GAP_S, repeats: int = 3,
                huge: bool = False) -> tuple[float, float]:
    """(ms to read `mib` MiB it has just read, ms to read them after `gap_s` s idle), medians
    of `repeats`, on 4 KB pages (or, `huge`, advised onto 2 MB ones). On a VM whose 4 KB pages
    left untouched a while cost a nested page walk each (this project's machines, 2026-12-07:
    16 MiB read in ~1 ms hot, tens to hundreds of ms after 0.5-2 s; on 2 MB pages a fraction
    of that) every request after an idle gap pays that for the memory it touches on 4 KB pages:
    a Poisson load at a low rate then measures the machine waking, not the load (`bench run`
    warns where latency rose as the rate fell). The bounded engine keeps its memory on 2 MB
    pages (engines/bounded/runtime/hugepages.py)."""
    import mmap

    import torch

    from engines.bounded.runtime.hugepages import HUGE as huge_page

    buf = mmap.mmap(-1, (mib << 20) + huge_page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None:  # Linux: the page size asked for, whatever the system's default
        buf.madvise(advice)
    whole = torch.frombuffer(buf, dtype=torch.uint8)
    start = -whole.data_ptr() % huge_page  # the first whole huge page
    x = whole[start:start + (mib << 20)].view(torch.float32)
    x.copy_(torch.arange(x.numel(), dtype=torch.float32))  # no two pages alike

    def read() -> float:
        t = time.perf_counter()
        x.sum()
        return (time.perf_counter() - t) * 1e3

    read()
    hot = statistics.median(read() for _ in range(repeats))
    idle = []
    for _ in range(repeats):
        time.sleep(gap_s)
        idle.append(read())
    del whole, x
    buf.close()
    return hot, statistics.median(idle)


def idle_memory_line(hot_ms: float, idle_ms: float, mib: int = IDLE_MIB, gap_s: float = IDLE_GAP_S,
                     huge_idle_ms: float | None = None) -> str:
    line = f"{mib} MiB read in {hot_ms:.2f} ms hot, {idle_ms:.2f} ms after {gap_s:g} s idle"
    huge = "" if huge_idle_ms is None else f"{huge_idle_ms:.2f} ms on 2 MB pages"
    if idle_ms > IDLE_SLOW * hot_ms:
        line += (f" ({idle_ms / hot_ms:.0f}x{'; ' + huge if huge else ''}): this machine slows after idle gaps; "
                 "requests at low rates (Poisson, the SLO search's lower probes) pay it for memory on 4 KB pages")
    elif huge:
        line += f" ({huge})"
    return line


_SHOWN_FLAGS = ("avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


def _engine_status(name: str) -> str:
    try:
        cls = engine_class(name)
        cls.check_available(EngineConfig(Path(".")))
        return "ok"
    except EngineUnavailable as e:
        return f"unavailable: {e}"
    except Exception as e:  # doctor reports, never crashes
        return f"unavailable: {type(e).__name__}: {e}"
