"""The compiled-runtime base, through both runtimes: the compiled graphs agree with eager
(and with transformers), the disk cache is reused for the same key and rebuilt for a
changed one, and a failing compiler falls back to eager."""
from __future__ import annotations

import asyncio
import random

import pytest
import torch

from engines.base import BeamRequest, Bounds, EngineConfig, PrefillRequest
from engines.bounded.engine import BoundedEngine
from engines.bounded.runtime import aot
from engines.hardware import onednn_int8_exact

from ..beam_reference import assert_same_beams, hf_beams
from ..conftest import random_seqs, reference
from ..tasks.test_beam import _prompt
from ..test_engine_beam import gather, output
from ..test_engine_beam import start as start_beam

BOUNDS = Bounds(max_samples_per_request=4, max_prompt_tokens=48)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("bounded-cache")


@pytest.fixture
def engine_factory(cache, monkeypatch):
    from harness.workload.presets import materialise

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
    status, d = _status(first), _package(first)
    assert status["compile"] == "aot" and d["compiled_now"] is True
    assert (first.describe().mode, first.describe().fallback) == ("aot", None)
    assert str(cache) in d["package"]
    assert not _build_copies(d["package"])  # Inductor's copy of the shared object is gone
    reqs = _requests()
    got = asyncio.run(_gather(first, reqs))
    ref = reference(first.config.model_dir)
    for r, res in zip(reqs, got):
        assert (torch.tensor(res.scores) - ref.scores(r.samples, r.labels)).abs().max().item() < 1e-4
    # the package also runs a query shared by its items (the attention op's prefix argument)
    query, items = list(range(100, 130)), [[5, 6, 7], list(range(200, 218)), [9]]
    shared = asyncio.run(first.submit(PrefillRequest.with_query("q", query, items, [11, 22])))
    want = ref.scores([query + i for i in items], [11, 22])
    assert (torch.tensor(shared.scores) - want).abs().max().item() < 1e-4

    second = engine_factory()  # same key: loads the cached package
    assert _package(second)["compiled_now"] is False
    assert _package(second)["package"] == d["package"]
    again = asyncio.run(second.submit(reqs[0]))
    assert torch.allclose(torch.tensor(again.scores), torch.tensor(got[0].scores), atol=1e-6)
    # under a profiler (every thread: the call runs on the engine's), the package call is
    # bench profile's range, its kernels inside it
    threads = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], experimental_config=threads) as prof:
        asyncio.run(second.submit(reqs[0]))
    graphs = [e for e in prof.events() if e.name == "bounded::graph"]
    assert len(graphs) == 1 and graphs[0].cpu_children

    bf16 = engine_factory("bfloat16", precision="bfloat16")  # changed key: compiles a new package
    assert _package(bf16)["compiled_now"] is True
    assert _package(bf16)["package"] != d["package"]
    assert len(list(cache.glob("compiled/*.pt2"))) == 2
    from engines.bounded.model.families import read_model_config
    from engines.bounded.model.precision import PrecisionPolicy
    from engines.bounded.runtime.compiled import unfrozen_for_prefill
    hidden = read_model_config(first.config.model_dir).hidden
    packages = [(first, "float32")] + [(bf16, "bfloat16")] * torch.ops.mkldnn._is_mkldnn_bf16_supported()
    for engine, dtype in packages:
        calls = _extern_calls(_package(engine)["package"])
        # unfrozen (AMX bf16; a tiny float32 model): plain weights, aten's or oneDNN's matmul
        if unfrozen_for_prefill(torch.device("cpu"), PrecisionPolicy(dtype), hidden):
            assert "aoti_torch_cpu_mm_out" in calls and "aoti_torch_cpu__linear_pointwise" not in calls, (dtype, calls)
        else:  # the layers' GEMMs use prepacked oneDNN weights
            assert "aoti_torch_cpu__linear_pointwise" in calls, (dtype, calls)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available() or not onednn_int8_exact(),
                    reason="oneDNN's int8 GEMMs (refused without VNNI or AMX)")
def test_int8_groups_compile_to_onednn_int8_kernels(engine_factory):
    e = engine_factory("float32", int8=["qkv", "o", "gate_up", "down"], gate="accept")
    calls = _extern_calls(_package(e)["package"])
    assert any("qlinear_pointwise" in c for c in calls), calls  # oneDNN's int8 linear, weights prepacked
    assert not any("_int_mm" in c for c in calls), calls  # every int8 GEMM was lowered so
    assert "aoti_torch_cpu__linear_pointwise" not in calls  # no float GEMM left in the layers
    reqs = _requests()
    got = asyncio.run(_gather(e, reqs))
    ref = reference(e.config.model_dir)
    for r, res in zip(reqs, got):
        want = ref.scores(r.samples, r.labels)
        assert (torch.tensor(res.scores).argmax(-1) == want.argmax(-1)).float().mean() >= 0.5


def test_bf16_int8_package_runs_the_mlp_middle_natively(engine_factory):
    """A bf16 engine with int8 gate_up and down: its package calls oneDNN's int8 kernel for
    every layer GEMM and the native scaled-SwiGLU-and-quantise between the two (no SwiGLU
    of its own), and scores as the reference does."""
    from engines.bounded.kernels import native

    if not native.load(log=lambda _: None) or not onednn_int8_exact():
        pytest.skip("needs the native bf16 kernels and oneDNN's exact int8 kernel (VNNI or AMX)")
    e = engine_factory("bfloat16", precision="bfloat16", int8=["qkv", "o", "gate_up", "down"], gate="accept")
    calls = _extern_calls(_package(e)["package"])
    assert any("qlinear_pointwise" in c for c in calls) and "aoti_torch_cpu__linear_pointwise" not in calls, calls
    text = _package_text(_package(e)["package"])
    assert "bounded_native::swiglu_quant_bf16" in text and "bounded_native::swiglu_bf16" not in text
    reqs = _requests()
    ref = reference(e.config.model_dir)
    for r, res in zip(reqs, asyncio.run(_gather(e, reqs))):
        want = ref.scores(r.samples, r.labels)
        assert (torch.tensor(res.scores).argmax(-1) == want.argmax(-1)).float().mean() >= 0.5


def _build_copies(package: str) -> list:
    import zipfile
    from pathlib import Path, PurePosixPath

    from torch._inductor.runtime.cache_dir_utils import cache_dir
    names = [PurePosixPath(n).name for n in zipfile.ZipFile(package).namelist() if n.endswith(".so")]
    assert names  # the package holds the model's shared object
    # searched at any depth, not only where aot.drop_build_copies looks
    return [f for n in names for f in Path(cache_dir()).rglob(n)]


def _status(engine) -> dict:
    return engine.describe().details["prefill_only"]["status"]


def _package(engine) -> dict:
    return _status(engine)["packages"]["score_prefill"]


def _extern_calls(package: str) -> set[str]:
    """The aten/oneDNN functions an AOTInductor package's generated wrapper calls."""
    import re
    import zipfile

    with zipfile.ZipFile(package) as z:
        src = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp"))
    return set(re.findall(r"aoti_torch_cpu_\w+", src))


def _package_text(package: str) -> str:
    """The generated sources and graph files of an AOTInductor package."""
    import zipfile

    with zipfile.ZipFile(package) as z:
        return "".join(z.read(n).decode(errors="ignore") for n in z.namelist() if n.endswith((".cpp", ".json")))


def test_padded_attention_compiles_into_the_package(engine_factory):
    """The GPU's prefill attention, compiled here: plain ops over the batch's device indices,
    no host-side custom op in the package (the CPU's per-sequence package calls one)."""
    padded = engine_factory(prefill_attention="padded")
    status = _status(padded)
    assert (status["compile"], status["prefill_attention"]) == ("aot", "padded")
    assert "bounded::varlen_attention" not in _package_text(_package(padded)["package"])
    per_sequence = engine_factory(prefill_attention="per_sequence")
    assert "bounded::varlen_attention" in _package_text(_package(per_sequence)["package"])
    reqs = _requests()
    ref = reference(padded.config.model_dir)
    for r, res in zip(reqs, asyncio.run(_gather(padded, reqs))):
        assert (torch.tensor(res.scores) - ref.scores(r.samples, r.labels)).abs().max().item() < 1e-4


def test_bf16_package_calls_the_native_kernel_itself(engine_factory):
    """Where the native kernels load, a bf16 engine's package calls the C++ ops with no Python
    op between (prefill_attention auto -> native; the SwiGLU), and scores as the per-sequence
    one does."""
    from engines.bounded.kernels import native

    if not native.load(log=lambda _: None):
        pytest.skip(f"native CPU attention unavailable here: {native.status()}")
    auto = engine_factory("bfloat16", precision="bfloat16")
    assert _status(auto)["prefill_attention"] == "native"
    text = _package_text(_package(auto)["package"])
    assert "bounded_native::varlen_attention_bf16" in text and "bounded::varlen_attention" not in text
    assert "bounded_native::swiglu_bf16" in text  # the MLP's SwiGLU too (kernels/dense.swiglu)
    per_sequence = engine_factory("bfloat16", precision="bfloat16", prefill_attention="per_sequence")
    reqs = _requests()
    for a, b in zip(asyncio.run(_gather(auto, reqs)), asyncio.run(_gather(per_sequence, reqs))):
        assert a.scores == b.scores  # the same kernel, called two ways


def test_compile_failure_falls_back_to_eager(engine_factory, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(aot, "compile_package", broken)
    e = engine_factory(max_labels=7)  # a key not in the cache, so compilation is attempted
    d = _status(e)
    assert d["compile"] == "eager" and "no C++ compiler here" in d["fallback_reason"]
    described = e.describe()  # what the summary table shows
    assert described.mode == "eager (AOT failed)" and "no C++ compiler here" in described.fallback
    res = asyncio.run(e.submit(_requests(1)[0]))
    assert len(res.scores) == len(_requests(1)[0].samples)


def test_beam_aot_graphs_agree_with_eager(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    bounds = Bounds(max_samples_per_request=1, max_prompt_tokens=64, max_beam_width=16, max_decode_steps=3)
    compiled = start_beam(tiny_dir, bounds=bounds, compile="aot")
    engine = start_beam(tiny_dir, max_wait_ms=200, max_batch_beams=160)  # eager
    try:
        status = compiled.describe().details["beam_search"]["status"]
        assert status["compile"] == "aot" and set(status["packages"]) == {"beam_prefill", "beam_step_w16"}
        rng = random.Random(3)
        reqs = [BeamRequest(f"r{i}", _prompt(i, rng.randint(1, 64)), w, 3) for i, w in enumerate((16, 9, 1))]
        for got, want in zip(asyncio.run(gather(compiled, reqs)), asyncio.run(gather(engine, reqs))):
            assert_same_beams(output(got), output(want))
    finally:
        compiled.stop()
        engine.stop()
    again = start_beam(tiny_dir, bounds=bounds, compile="aot")  # a second start only loads both
    try:
        packages = again.describe().details["beam_search"]["status"]["packages"]
        assert {n: p["compiled_now"] for n, p in packages.items()} == {"beam_prefill": False, "beam_step_w16": False}
    finally:
        again.stop()


def test_beam_compile_failure_falls_back_to_eager(tiny_dir, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(aot, "load_or_compile", broken)
    e = start_beam(tiny_dir, bounds=Bounds(max_samples_per_request=1, max_prompt_tokens=16, max_beam_width=4,
                                           max_decode_steps=2), compile="aot")
    try:
        status = e.describe().details["beam_search"]["status"]
        assert status["compile"] == "eager" and "no C++ compiler" in status["fallback_reason"]
        res = asyncio.run(e.submit(BeamRequest("r", [1, 2, 3], 4, 2)))
        assert_same_beams(output(res), hf_beams(tiny_dir, [1, 2, 3], 4, 2))
    finally:
        e.stop()


def test_small_work_runs_on_one_thread_unless_it_streams_much_memory():
    from engines.bounded.runtime.compiled import SERIAL_BYTES, SERIAL_FLOPS, threads_for

    cpu, before = torch.device("cpu"), torch.get_num_threads()
    if before < 2:
        pytest.skip("one thread here: nothing to tell apart")
    seen = []
    for flops, nbytes in ((1e6, 0), (SERIAL_FLOPS, 0), (1e6, SERIAL_BYTES)):  # small; many FLOPs; a big weight
        with threads_for(cpu, flops, nbytes):
            seen.append(torch.get_num_threads())
    assert seen == [1, before, before] and torch.get_num_threads() == before


def test_while_the_host_is_busy_small_work_stays_on_one_thread_up_to_the_busy_bound():
    from engines.bounded.runtime.compiled import SERIAL_FLOPS, SERIAL_FLOPS_BUSY, host_busy, threads_for

    cpu, before = torch.device("cpu"), torch.get_num_threads()
    if before < 2:
        pytest.skip("one thread here: nothing to tell apart")
    seen = []
    with host_busy(True):
        for flops in (SERIAL_FLOPS, SERIAL_FLOPS_BUSY):
            with threads_for(cpu, flops):
                seen.append(torch.get_num_threads())
        with host_busy(False), threads_for(cpu, SERIAL_FLOPS):  # nested: the inner word holds, then the outer
            seen.append(torch.get_num_threads())
        with threads_for(cpu, SERIAL_FLOPS):
            seen.append(torch.get_num_threads())
    assert seen == [1, before, before, 1] and torch.get_num_threads() == before
