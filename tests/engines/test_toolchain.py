"""The AOT toolchain checks: each names what it found or what is missing and how to provide
it (folders made here stand in for a CUDA install; the compiler check runs for real)."""
from __future__ import annotations

from engines import toolchain


def test_this_machine_has_a_cpu_toolchain():
    # the CPU AOT tests compile packages here, so a C++ compiler must be found
    assert toolchain.missing("cpu") == []
    compiler = toolchain.check("cpu")[0]
    assert compiler.name == "C++ compiler" and compiler.ok and compiler.detail


def test_cuda_headers_found_in_cuda_home_or_named_with_a_fix(tmp_path):
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    (home / "include" / "cuda.h").write_text("")
    part = toolchain.cuda_headers(str(home), extra_roots=[])
    assert not part.ok and "cuda_runtime_api.h missing" in part.detail
    (home / "include" / "cuda_runtime_api.h").write_text("")
    assert toolchain.cuda_headers(str(home)).ok
    none = toolchain.cuda_headers(None, extra_roots=[home])  # e.g. pip's nvidia packages
    assert not none.ok and "no CUDA_HOME" in none.detail and f"export CUDA_HOME={home}" in none.detail


def test_driver_library_for_linking(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    assert "is the NVIDIA driver installed" in toolchain.cuda_link_library([str(lib)]).detail
    (lib / "libcuda.so.1").write_text("")
    only_versioned = toolchain.cuda_link_library([str(lib)])
    assert not only_versioned.ok and "ln -sf" in only_versioned.detail and "LIBRARY_PATH" in only_versioned.detail
    (lib / "libcuda.so").symlink_to(lib / "libcuda.so.1")
    assert toolchain.cuda_link_library([str(tmp_path / "none"), str(lib)]).ok
