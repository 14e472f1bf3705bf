"""runtime/aligned.py: a CPU package's shared object linked with the aligned __wrap_malloc --
the wrap itself (large blocks on 64-byte boundaries, small ones as malloc gives them), the
link line it changes (an AOT shared object's only), the builder patch's lifetime, and a real
package built with it."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

from engines.bounded.runtime import aligned, aot, hugepages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None,
                                reason="the wrap is linked on Linux (and read back with nm)")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _linked(cache, name: str, body: str):
    """`extern "C" uint64_t name(size_t n) { body }` in a shared object linked with the wrap."""
    obj = aligned.build_object(log=lambda _: None)
    assert obj is not None and obj.is_file(), aligned.status()
    probe = cache / f"{name}.cpp"
    probe.write_text(f'#include <stdlib.h>\n#include <stdint.h>\nextern "C" uint64_t {name}(size_t n) {{ {body} }}\n')
    from torch._inductor.cpp_builder import get_cpp_compiler

    lib = cache / f"{name}.so"
    subprocess.run([get_cpp_compiler(), "-shared", "-fPIC", str(probe), "-o", str(lib), aligned.LINK_FLAGS, str(obj)],
                   check=True, capture_output=True)
    fn = getattr(ctypes.CDLL(str(lib)), name)
    fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_size_t]
    return fn


def test_the_wrap_serves_large_blocks_on_cache_lines(cache):
    offset_of = _linked(cache, "offset_of", "void* p = malloc(n); uint64_t r = (uintptr_t)p % 64; free(p); return r;")
    # glibc alone puts a mapped block 16 bytes past its page and a heap block on 16 bytes
    assert all(offset_of(n) == 0 for n in (1 << 20, (3 << 20) + 5, 200 << 20))
    assert all(offset_of(n) % 16 == 0 for n in (24, 4096, (1 << 20) - 1))  # small ones: malloc's own


def test_the_wrap_puts_blocks_of_2_mb_and_more_on_advised_huge_page_boundaries(cache):
    keep = _linked(cache, "keep", "return (uintptr_t)malloc(n);")
    huge, small = keep((6 << 20) + 100), keep(1 << 20)
    assert huge % (2 << 20) == 0 and small % 64 == 0
    holding = [m for m in hugepages.mappings() if m.start <= huge < m.end]
    assert holding and "hg" in holding[0].flags  # MADV_HUGEPAGE: its faults take 2 MB pages


def test_only_an_aot_shared_objects_link_line_changes(cache):
    obj = cache / "w.o"

    class Builder:
        def __init__(self, aot_mode, do_link, target):
            self._aot_mode, self._do_link, self._target_file = aot_mode, do_link, target

        def get_command_line(self):
            return "g++ in -o out"

    linker = aligned._linker(Builder, obj)
    assert linker(True, True, "/x/m.wrapper.so").get_command_line() == f"g++ in -o out {aligned.LINK_FLAGS} {obj}"
    assert linker(True, False, "/x/m.wrapper.o").get_command_line() == "g++ in -o out"  # a compile step
    assert linker(False, True, "/x/kernel.so").get_command_line() == "g++ in -o out"  # torch.compile's, not AOT


def test_the_builder_patch_is_shared_and_removed_by_the_last_holder(cache):
    import torch._inductor.codecache as codecache

    original = codecache.CppBuilder
    with aligned.aligned_constants(log=lambda _: None) as on:
        assert on and codecache.CppBuilder is not original and issubclass(codecache.CppBuilder, original)
        patched = codecache.CppBuilder
        with aligned.aligned_constants(log=lambda _: None):
            assert codecache.CppBuilder is patched
        assert codecache.CppBuilder is patched  # the outer holder still holds it
    assert codecache.CppBuilder is original


def test_without_the_object_packages_link_as_before(cache, monkeypatch):
    import torch._inductor.codecache as codecache

    monkeypatch.setattr(aligned, "build_object", lambda log: None)
    original = codecache.CppBuilder
    with aligned.aligned_constants(log=lambda _: None) as on:
        assert not on and codecache.CppBuilder is original


def test_a_cpu_package_links_the_wrap_and_runs(cache):
    class Affine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.randn(48, 32))

        def forward(self, x):
            return x @ self.w.t() + 1

    m, x = Affine(), torch.randn(5, 32)
    key = aot.CompileKey("aligned_test", "m", "float32", "float32", "dense", "cpu", torch.__version__, (5,))
    path = aot.compile_package(key, m, (x,), ({0: torch.export.Dim("t", min=2, max=64)},), log=lambda _: None)
    so = cache / "m.so"
    with zipfile.ZipFile(path) as z:
        so.write_bytes(z.read(next(n for n in z.namelist() if n.endswith(".so"))))
    symbols = subprocess.run(["nm", str(so)], check=True, capture_output=True, text=True).stdout
    assert " t __wrap_malloc" in symbols and "posix_memalign" in symbols
    torch.testing.assert_close(aot.load_package(path)(x), m(x))


def test_turned_off_packages_link_as_before_under_their_own_key(cache, monkeypatch):
    import torch._inductor.codecache as codecache

    key = aot.CompileKey("p", "m", "float32", "float32", "dense", "cpu", torch.__version__, (5,))
    monkeypatch.setenv("BOUNDED_ALIGNED", "0")
    off = aot.CompileKey("p", "m", "float32", "float32", "dense", "cpu", torch.__version__, (5,))
    assert key.aligned and not off.aligned and key.package_path() != off.package_path()
    with aligned.aligned_constants(log=lambda _: None) as on:
        assert not on and codecache.CppBuilder.__name__ != "AlignedLink"
    assert "BOUNDED_ALIGNED=0" in aligned.status()
