"""`bench doctor`'s AOT toolchain lines: each check of engines/toolchain.py on its own line,
found or missing."""
from __future__ import annotations

from harness.device.doctor import IDLE_GAP_S, IDLE_MIB, idle_memory, idle_memory_line, toolchain_lines


def test_doctor_names_each_toolchain_check():
    lines = dict(toolchain_lines("cpu"))
    assert list(lines) == ["aot cpu C++ compiler"]
    assert lines["aot cpu C++ compiler"].startswith("ok: ")  # the CPU AOT tests need one here
    cuda = dict(toolchain_lines("cuda"))  # on a CPU-only machine: what a GPU one would need
    assert list(cuda) == ["aot cuda C++ compiler", "aot cuda CUDA headers", "aot cuda libcuda.so (link)",
                          "aot cuda CUDA driver", "aot cuda triton"]
    assert all(v.startswith(("ok: ", "MISSING: ")) for v in cuda.values())


def test_idle_memory_reads_hot_then_after_a_gap():
    for huge in (False, True):
        hot, idle = idle_memory(mib=1, gap_s=0.01, repeats=2, huge=huge)
        assert 0 < hot < 1e4 and 0 < idle < 1e4


def test_idle_memory_line_says_when_the_machine_slows_after_idle():
    assert idle_memory_line(0.7, 1.0) == f"{IDLE_MIB} MiB read in 0.70 ms hot, 1.00 ms after {IDLE_GAP_S:g} s idle"
    slow = idle_memory_line(0.5, 30.0)
    assert "(60x): this machine slows after idle gaps" in slow and slow.startswith(f"{IDLE_MIB} MiB read in 0.50 ms")
    both = idle_memory_line(0.5, 30.0, huge_idle_ms=1.25)
    assert f"30.00 ms after {IDLE_GAP_S:g} s idle (60x; 1.25 ms on 2 MB pages): this machine slows" in both
    assert idle_memory_line(0.7, 1.0, huge_idle_ms=0.8).endswith(f"1.00 ms after {IDLE_GAP_S:g} s idle (0.80 ms on 2 MB pages)")


def test_doctor_says_how_fast_the_host_runs_the_cached_gemm_now(tmp_path, monkeypatch):
    import harness.device.peak as peak
    from harness.device import doctor
    from tests.engines.test_hardware import ICE_LAKE

    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    peak.cpu_peaks(ICE_LAKE, measure=lambda caps: {"float32": {peak.SPOT_SHAPE: 0.32}})
    monkeypatch.setattr(peak, "spot_rate", lambda caps, dtype, seconds=0.2: 0.16)
    lines = dict(doctor.device_lines("cpu", measure=False, caps=ICE_LAKE))
    now = lines["cpu now"]
    assert now.startswith("float32 2048 square GEMM 160 GFLOP/s, 50% of the cached rate: busy or throttled now")
    monkeypatch.setattr(peak, "spot_rate", lambda caps, dtype, seconds=0.2: 0.31)
    assert dict(doctor.device_lines("cpu", measure=False, caps=ICE_LAKE))["cpu now"].endswith("97% of the cached rate")
