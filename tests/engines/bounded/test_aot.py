"""AOT compilation: the compiled graph agrees with eager, the disk cache is reused for the
same key and rebuilt for a changed one, and a failing compiler falls back to eager."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import pytest
import torch

from engines.base import Bounds, EngineConfig, PrefillRequest
from engines.bounded import aot
from engines.bounded.engine import BoundedEngine

from .conftest import random_seqs, reference

BOUNDS = Bounds(max_samples_per_request=4, max_prompt_tokens=48)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("bounded-cache")


@pytest.fixture
def engine_factory(cache, monkeypatch):
    from harness.presets import materialise

    model_dir = materialise("tiny", log=lambda s: None)  # before the cache root moves
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(cache))
    started = []

    def make(dtype="float32", **options):
        e = BoundedEngine(EngineConfig(model_dir, dtype, "cpu", BOUNDS, "prefill_only",
                                       {"compile": "aot", **options}))
        e.start()
        started.append(e)
        return e

    yield make
    for e in started:
        e.stop()


async def _gather(engine, reqs):
    return await asyncio.gather(*(engine.submit(r) for r in reqs))


def _requests(n=3):
    rng = random.Random(5)
    return [PrefillRequest(f"r{i}", random_seqs(rng, rng.randint(1, 4), 1, 48), [11, 22, 33]) for i in range(n)]


def test_compile_once_then_load_and_recompile_on_key_change(engine_factory, cache):
    first = engine_factory()
    d = first.describe()
    assert d["compile"] == "aot" and d["compiled_now"] is True
    assert str(cache) in d["package"]
    reqs = _requests()
    got = asyncio.run(_gather(first, reqs))
    ref = reference(first.config.model_dir)
    for r, res in zip(reqs, got):
        assert (torch.tensor(res.scores) - ref.scores(r.samples, r.labels)).abs().max().item() < 1e-4

    second = engine_factory()  # same key: loads the cached package
    assert second.describe()["compiled_now"] is False
    assert second.describe()["package"] == d["package"]
    again = asyncio.run(second.submit(reqs[0]))
    assert torch.allclose(torch.tensor(again.scores), torch.tensor(got[0].scores), atol=1e-6)

    bf16 = engine_factory("bfloat16")  # changed key: compiles a new package
    assert bf16.describe()["compiled_now"] is True
    assert bf16.describe()["package"] != d["package"]
    assert len(list(cache.glob("compiled/*.pt2"))) == 2
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # the layers' GEMMs use prepacked oneDNN weights
        assert "aoti_torch_cpu__linear_pointwise" in _extern_calls(bf16.describe()["package"])


def _extern_calls(package: str) -> set[str]:
    """The aten/oneDNN functions an AOTInductor package's generated wrapper calls."""
    import re
    import zipfile

    with zipfile.ZipFile(package) as z:
        src = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp"))
    return set(re.findall(r"aoti_torch_cpu_\w+", src))


def test_superseded_packages_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    shapes = aot.ShapePolicy(8, 2, 4)
    old = aot.CompileKey("p", "m", "float32", "float32", "", "cpu", "0.1", shapes, code="old")
    other_dtype = aot.CompileKey("p", "m", "bfloat16", "float32", "", "cpu", "0.1", shapes, code="old")
    new = aot.CompileKey("p", "m", "float32", "float32", "", "cpu", "0.2", shapes, code="new")
    for k in (old, other_dtype, new):
        k.package_path().parent.mkdir(parents=True, exist_ok=True)
        k.package_path().write_bytes(b"x")
        k.package_path().with_suffix(".json").write_text(json.dumps(dataclasses.asdict(k)))
    aot.prune_superseded(new, log=lambda m: None)
    assert not old.package_path().exists() and not old.package_path().with_suffix(".json").exists()
    assert other_dtype.package_path().exists() and new.package_path().exists()


def test_compile_failure_falls_back_to_eager(engine_factory, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(aot, "compile_package", broken)
    e = engine_factory(max_labels=7)  # a key not in the cache, so compilation is attempted
    d = e.describe()
    assert d["compile"] == "eager" and "no C++ compiler here" in d["fallback_reason"]
    res = asyncio.run(e.submit(_requests(1)[0]))
    assert len(res.scores) == len(_requests(1)[0].samples)
