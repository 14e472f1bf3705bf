"""The AOT package cache: superseded packages pruned, and the cache key's code digest
taken from whole source folders."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import zipfile
from pathlib import Path

from engines.bounded.plan import PrefillPlan
from engines.bounded.runtime import aot


def test_superseded_packages_are_pruned_but_the_newest_before(tmp_path, monkeypatch):
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    shapes = PrefillPlan(8, 2, 4)
    oldest = aot.CompileKey("p", "m", "float32", "float32", "", "cpu", "0.1", shapes, code="oldest")
    old = aot.CompileKey("p", "m", "float32", "float32", "", "cpu", "0.1", shapes, code="old")
    other_dtype = aot.CompileKey("p", "m", "bfloat16", "float32", "", "cpu", "0.1", shapes, code="oldest")
    new = aot.CompileKey("p", "m", "float32", "float32", "", "cpu", "0.2", shapes, code="new")
    for age, k in enumerate((new, old, other_dtype, oldest)):  # written: oldest first, new last
        k.package_path().parent.mkdir(parents=True, exist_ok=True)
        k.package_path().write_bytes(b"x")
        meta = k.package_path().with_suffix(".json")
        meta.write_text(json.dumps(dataclasses.asdict(k)))
        os.utime(meta, (1e9 - age * 100, 1e9 - age * 100))
    aot.prune_superseded(new, log=lambda m: None)
    assert not oldest.package_path().exists() and not oldest.package_path().with_suffix(".json").exists()
    assert old.package_path().exists()  # another checkout's build, the newest before this one
    assert other_dtype.package_path().exists() and new.package_path().exists()
    aot.prune_superseded(new, log=lambda m: None, keep=1)
    assert not old.package_path().exists() and new.package_path().exists()


def test_code_digest_covers_whole_graph_folders_only(tmp_path):
    src = Path(aot.__file__).parent.parent  # engines/bounded
    root = tmp_path / "bounded"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("__pycache__"))
    base = aot.source_digest(root)
    assert base == aot.source_digest()

    def changed(path: str, text: str = "\n# edited\n") -> bool:
        f = root / path
        before = f.read_text() if f.exists() else None
        f.write_text((before or "") + text)
        try:
            return aot.source_digest(root) != base
        finally:
            f.unlink() if before is None else f.write_text(before)

    assert all(changed(p) for p in ("model/layers.py", "kernels/dense.py", "programs/beam.py",
                                     "runtime/buffers.py", "kernels/new_kernel.py"))
    assert not any(changed(p) for p in ("tasks/beam.py", "engine.py", "options.py", "plan.py"))


def test_build_copies_of_a_package_are_dropped_from_inductors_cache(tmp_path, monkeypatch):
    inductor = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    package = tmp_path / "p.pt2"
    with zipfile.ZipFile(package, "w") as z:
        z.writestr("p/data/aotinductor/model/cabc.wrapper.so", b"so")
        z.writestr("p/data/aotinductor/model/cabc.wrapper.cpp", b"cpp")
    (inductor / "c7").mkdir(parents=True)
    (inductor / "c7" / "cabc.wrapper.so").write_bytes(b"x" * 1000)  # the build's copy
    (inductor / "c7" / "cabc.wrapper.cpp").write_bytes(b"src")  # sources stay (small)
    (inductor / "c8").mkdir()
    (inductor / "c8" / "cdef.wrapper.so").write_bytes(b"y" * 10)  # another package's build
    logged = []
    assert aot.drop_build_copies(package, logged.append) == 1000
    assert not (inductor / "c7" / "cabc.wrapper.so").exists()
    assert (inductor / "c7" / "cabc.wrapper.cpp").exists() and (inductor / "c8" / "cdef.wrapper.so").exists()
    assert aot.drop_build_copies(package, logged.append) == 0  # nothing left to free
    assert aot.drop_build_copies(tmp_path / "missing.pt2", logged.append) == 0
    assert "left Inductor's build files in place" in logged[-1]


def test_prefill_packages_are_unfrozen_for_dense_bf16_on_amx_and_tiny_float32_models(monkeypatch):
    import torch

    from engines.bounded.model.precision import PrecisionPolicy
    from engines.bounded.runtime import compiled

    cpu, bf16, f32 = torch.device("cpu"), PrecisionPolicy("bfloat16"), PrecisionPolicy("float32")
    big, tiny = 896, 64  # hidden sizes: qwen2.5-0.5b, the tiny models
    monkeypatch.setattr(compiled, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    assert compiled.unfrozen_for_prefill(cpu, bf16, big)
    assert not compiled.unfrozen_for_prefill(cpu, PrecisionPolicy("bfloat16", gemm={"gate_up": "int8"}), big)  # qlinear needs freezing
    assert not compiled.unfrozen_for_prefill(cpu, f32, big)
    assert compiled.unfrozen_for_prefill(cpu, f32, tiny)  # aten's mm: less fixed cost at K = 64
    assert not compiled.unfrozen_for_prefill(cpu, PrecisionPolicy("float32", gemm={"gate_up": "int8"}), tiny)
    assert not compiled.unfrozen_for_prefill(torch.device("cuda"), f32, tiny)
    monkeypatch.setattr(compiled, "cpu_flags", lambda: frozenset({"avx512_bf16"}))  # Zen 4: freezing is faster
    assert not compiled.unfrozen_for_prefill(cpu, bf16, big)
    assert not compiled.unfrozen_for_prefill(cpu, bf16, tiny)
