"""`bench doctor`: what this machine has and which engines can run on it."""
from __future__ import annotations

import importlib.metadata as md
import platform
from pathlib import Path
from typing import Iterator

from engines.base import EngineConfig, EngineUnavailable
from engines.registry import ENGINES, engine_class


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


def report(measure: bool = False) -> Iterator[tuple[str, str]]:
    import harness
    from harness.peak import _cpu_name, cpu_peak_tflops, gpu_peak_tflops
    from harness.presets import cache_root

    yield "bounded-bench", harness.__version__
    yield "python", platform.python_version()
    for pkg in ("torch", "transformers", "pydantic", "httpx"):
        yield pkg, _version(pkg)
    yield "cpu", _cpu_name()
    import torch

    yield "torch threads", str(torch.get_num_threads())
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        yield "gpu", f"{name} (peak {gpu_peak_tflops(name) or 'unknown'} TFLOP/s bf16)"
    else:
        yield "gpu", "none"
    peak_file = cache_root() / "peak.json"
    if measure or peak_file.exists():
        yield "cpu peak", f"{cpu_peak_tflops('bfloat16', refresh=measure) * 1e3:.0f} GFLOP/s bf16 (cached in {peak_file})"
    else:
        yield "cpu peak", "not measured yet (bench doctor --measure, or the first bench run)"
    yield "cache", str(cache_root())
    for device in ("cpu", *(["cuda"] if torch.cuda.is_available() else [])):
        yield from toolchain_lines(device)
    for name in ENGINES:
        yield f"engine {name}", _engine_status(name)


def toolchain_lines(device: str) -> Iterator[tuple[str, str]]:
    """What AOTInductor needs to compile packages for `device`, each found or missing (and how
    to provide it); without them the bounded engine serves eagerly and says why."""
    from engines import toolchain

    for c in toolchain.check(device):
        yield f"aot {device} {c.name}", ("ok: " if c.ok else "MISSING: ") + c.detail


def _engine_status(name: str) -> str:
    try:
        cls = engine_class(name)
        cls.check_available(EngineConfig(Path(".")))
        return "ok"
    except EngineUnavailable as e:
        return f"unavailable: {e}"
    except Exception as e:  # doctor reports, never crashes
        return f"unavailable: {type(e).__name__}: {e}"
