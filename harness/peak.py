"""Peak dense FLOP/s of the device, the denominator of effective MFU: a table for known GPUs;
on a CPU a short measured matmul peak, cached on disk."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from harness.presets import cache_root

# dense bf16/fp16 tensor-core TFLOP/s (no sparsity), by substring of the device name
GPU_BF16_TFLOPS = {
    "H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H20": 148.0,
    "B200": 2250.0, "GB200": 2500.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L40": 181.0,
    "L20": 119.5, "L4": 121.0, "A10G": 70.0, "A10": 125.0, "RTX 4090": 165.2, "RTX 3090": 71.0, "V100": 125.0,
}


def gpu_peak_tflops(device_name: str) -> float | None:
    for key in sorted(GPU_BF16_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return GPU_BF16_TFLOPS[key]
    return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def measure_cpu_tflops(dtype: str = "bfloat16", n: int = 2048, seconds: float = 1.0) -> float:
    """Best-of matmul rate: [n, n] x [n, n] in `dtype` with torch's threads."""
    import torch

    dt = getattr(torch, dtype)
    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
    for _ in range(2):
        torch.mm(a, b)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    return best / 1e12


def cpu_peak_tflops(dtype: str = "bfloat16", refresh: bool = False) -> float:
    import torch

    key = f"{_cpu_name()}|{dtype}|torch {torch.__version__}|threads {torch.get_num_threads()}"
    path = cache_root() / "peak.json"
    cache = json.loads(path.read_text()) if path.exists() else {}
    if key not in cache or refresh:
        cache[key] = measure_cpu_tflops(dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    return cache[key]


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return _cpu_name()


def peak_tflops(device: str, dtype: str = "bfloat16") -> tuple[float, str]:
    """(peak TFLOP/s, how it was obtained)."""
    name = device_name(device)
    if device.startswith("cuda"):
        tf = gpu_peak_tflops(name)
        if tf is None:
            raise ValueError(f"no peak known for GPU {name!r}; pass --peak-tflops")
        scale = 0.5 if dtype == "float32" else 1.0  # TF32 tensor cores run at half the bf16 rate
        return tf * scale, f"table: {name} dense {dtype}"
    return cpu_peak_tflops(dtype), f"measured: {dtype} {2048}x{2048} matmul on {name} (cached)"
