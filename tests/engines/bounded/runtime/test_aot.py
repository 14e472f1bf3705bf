"""The AOT package cache: superseded packages pruned, and the cache key's code digest
taken from whole source folders."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
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
