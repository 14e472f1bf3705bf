"""`bench doctor`'s AOT toolchain lines: each check of engines/toolchain.py on its own line,
found or missing."""
from __future__ import annotations

from harness.device.doctor import toolchain_lines


def test_doctor_names_each_toolchain_check():
    lines = dict(toolchain_lines("cpu"))
    assert list(lines) == ["aot cpu C++ compiler"]
    assert lines["aot cpu C++ compiler"].startswith("ok: ")  # the CPU AOT tests need one here
    cuda = dict(toolchain_lines("cuda"))  # on a CPU-only machine: what a GPU one would need
    assert list(cuda) == ["aot cuda C++ compiler", "aot cuda CUDA headers", "aot cuda libcuda.so (link)",
                          "aot cuda CUDA driver", "aot cuda triton"]
    assert all(v.startswith(("ok: ", "MISSING: ")) for v in cuda.values())
