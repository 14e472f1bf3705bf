"""The bounded engine's GPU path on a real CUDA device (skipped without one; tools/gpu_check.sh
runs these first): pinned staging, the padded attention, no host sync between the first
kernel and the result (torch.cuda.set_sync_debug_mode("error") around the walk), CUDA graphs
of the decode steps against the uncaptured steps and transformers, the AOT packages under
capture, device-event stage times, FP8 rowwise GEMMs. References run in float32 on the CPU.
"""
from __future__ import annotations

import contextlib
import random

import pytest
import torch

from engines import toolchain
from engines.bounded.kernels import attention, dense
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.plan import BeamPlan, PrefillPlan
from engines.bounded.runtime.beam_batch import BeamJob
from engines.bounded.runtime.buffers import pack
from engines.bounded.runtime.prefill import PrefillRuntime
from engines.bounded.runtime.staging import Staging
from engines.bounded.tasks.dag import Dag, EventClock, Node

from .beam_reference import assert_same_beams, hf_beams, runner
from .conftest import random_seqs, reference
from .kernels.test_attention import packed_attention_loop
from .tasks.test_beam import _prompt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (tools/gpu_check.sh)")
CUDA = "cuda"


@contextlib.contextmanager
def no_host_sync():
    """Any synchronising CUDA call inside raises (device reads, blocking copies, nonzero, ...)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_staging_is_pinned_and_lands_on_the_device():
    st = Staging(256, torch.device(CUDA))
    assert st.host_buffer.is_pinned() and st.device_buffer.is_cuda and not st.shared
    for batch in range(3):
        st.begin()
        with no_host_sync():
            views = [st.put(list(range(batch, batch + n))) for n in (5, 17, 1)]
        assert [v.tolist() for v in views] == [list(range(batch, batch + n)) for n in (5, 17, 1)]


def test_padded_attention_on_cuda_matches_one_sdpa_per_sequence():
    torch.manual_seed(0)
    lengths = [5, 1, 17, 90, 33]
    t = sum(lengths)
    q, k, v = torch.randn(t, 8, 64), torch.randn(t, 2, 64), torch.randn(t, 2, 64)
    b = pack([[0] * n for n in lengths], CUDA)
    want = packed_attention_loop(q, k, v, list(b.spans))
    attend = attention.packed_attention("padded", b.cu_seqlens, b.pad_index, b.unpad_index)
    with no_host_sync():
        got = attend(*(x.to(CUDA, torch.bfloat16) for x in (q, k, v)))
    assert (got.float().cpu() - want).abs().max().item() < 3e-2


def test_prefill_on_cuda_matches_transformers_without_host_sync(tiny_dir):
    rt = PrefillRuntime(tiny_dir, PrecisionPolicy("float32"), CUDA, PrefillPlan(2048, 64, 512, 16), "eager",
                        lambda s: None)
    rt.start()
    assert rt.attention == "padded"
    rng = random.Random(1)
    seqs, labels = random_seqs(rng, 12, 1, 300), [11, 22, 33]
    for _ in range(2):  # the second batch reuses the staging buffer
        packed, label_ids = rt.pack(seqs, labels)
        with no_host_sync(), torch.inference_mode():
            logits = rt._graph(*packed.varlen_args(), packed.prefix, label_ids)
        got = torch.softmax(logits.float().cpu(), -1)
        assert (got - reference(tiny_dir).scores(seqs, labels)).abs().max().item() < 1e-3


def _walk(walker, jobs):
    """The beam walk with the host-sync check on, up to the outputs (where the result is read)."""
    rt = walker.runtime
    with no_host_sync():
        batch = rt.prefill(jobs)
        for j in range(1, jobs[0].steps + 1):
            batch = rt.step(batch, j)
    return rt.outputs(batch)


PLAN = BeamPlan(max_requests=4, max_width=64, max_steps=4, max_prompt=96)


@pytest.mark.parametrize("graphs", [True, False])
def test_beam_walk_on_cuda_matches_generate_without_host_sync(tiny_dir, graphs):
    walker = runner(tiny_dir, plan=PLAN, device=CUDA, cuda_graphs=graphs)
    status = walker.runtime.status["cuda_graphs"]
    assert (status["captured"] == 2 * len(PLAN.request_buckets(64))) if graphs else status == "off"
    rng = random.Random(7)
    jobs = [BeamJob(_prompt(rng.randrange(999), rng.randint(1, 96)), w, 4) for w in (64, 7, 30)]
    for _ in range(2):
        for out, job in zip(_walk(walker, jobs), jobs):
            assert_same_beams(out, hf_beams(tiny_dir, job.prompt, job.width, job.steps))


def test_beam_aot_packages_under_cuda_graphs_match_eager(tiny_dir, tmp_path, monkeypatch):
    missing = toolchain.missing("cuda")
    if missing:
        pytest.skip(f"AOT toolchain: {'; '.join(missing)}")
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    plan = BeamPlan(max_requests=2, max_width=16, max_steps=3, max_prompt=48)
    compiled = runner(tiny_dir, plan=plan, compile_mode="aot", device=CUDA)
    assert compiled.runtime.status["compile"] == "aot", compiled.runtime.status.get("fallback_reason")
    assert compiled.runtime.status["cuda_graphs"]["captured"] == 4
    eager = runner(tiny_dir, plan=plan, device=CUDA, cuda_graphs=False)
    jobs = [BeamJob(_prompt(3, 40), 16, 3), BeamJob(_prompt(4, 5), 9, 3)]
    for got, want in zip(_walk(compiled, jobs), _walk(eager, jobs)):
        assert_same_beams(got, want, tol=1e-3)


def test_event_clock_puts_device_time_in_its_node():
    a = torch.randn(4096, 4096, device=CUDA)
    dag = Dag([Node("mm", lambda: [a @ a for _ in range(20)], ()), Node("nothing", lambda: None, ())], inputs={})
    stages = {}
    dag.run("batch", {}, stages, EventClock(lambda: torch.cuda.Event(enable_timing=True)))
    assert stages["mm"] > 10 * stages["nothing"] and stages["mm"] > 0.1  # the matmuls' time is mm's


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 GEMMs need compute capability >= 8.9")
def test_fp8_rowwise_gemm_on_cuda_is_close_to_bf16():
    torch.manual_seed(0)
    w = torch.randn(3072, 1024, device=CUDA) * 0.02
    w[7] *= 1e5  # one large output row: rowwise scales keep the others precise
    x = torch.randn(300, 1024, device=CUDA, dtype=torch.bfloat16)
    bias = torch.randn(3072, device=CUDA, dtype=torch.bfloat16)
    w8, scale = dense.fp8_quantise(w.bfloat16())
    with no_host_sync():
        got = dense.fp8_linear(x, w8, scale, bias)
    want = x.float() @ w.t() + bias.float()
    assert got.dtype == torch.bfloat16
    rel = ((got.float() - want).norm(dim=0) / want.norm(dim=0))  # per output feature
    assert rel.max().item() < 0.08 and rel.median().item() < 0.05  # as on the CPU (kernels/test_dense.py)
