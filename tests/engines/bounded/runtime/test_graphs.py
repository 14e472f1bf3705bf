"""The beam decode step as it runs under CUDA graphs, checked on a CPU: captured once per
(width, requests bucket, parity) on the planned buffers, prompts laid out at the plan's
bound, batches padded to a requests bucket, and each step only filling the static inputs
and replaying. A stand-in backend replays a capture by re-running the captured call into
the captured outputs -- what a CUDA graph replay does to the same memory -- so a step that
fed its graph anything but the static buffers would answer wrongly here too."""
from __future__ import annotations

import random

import pytest
from torch.utils._pytree import tree_leaves

from engines.bounded.kernels.constraints import build_trie
from engines.bounded.plan import BeamPlan
from engines.bounded.runtime.beam_batch import BeamJob
from engines.bounded.runtime.graphs import GraphSet

from ..beam_reference import assert_same_beams, hf_beams, runner
from ..conftest import VOCAB
from ..tasks.test_beam import _codes, _prompt


class Replayed:
    def __init__(self, call, outputs):
        self.call, self.outputs, self.replays = call, outputs, 0

    def replay(self) -> None:
        for kept, new in zip(tree_leaves(self.outputs), tree_leaves(self.call())):
            if kept.data_ptr() != new.data_ptr():
                kept.copy_(new)
        self.replays += 1


class ReplayByCall:
    """A CUDA graph stand-in: capture runs the call once and keeps its outputs."""

    def __init__(self):
        self.captured: list[Replayed] = []

    def capture(self, call) -> Replayed:
        c = Replayed(call, call())
        self.captured.append(c)
        return c


PLAN = BeamPlan(max_requests=4, max_width=24, max_steps=4, max_prompt=40)


@pytest.fixture(scope="module")
def backend():
    return ReplayByCall()


@pytest.fixture(scope="module")
def walker(tiny_dir, backend):
    return runner(tiny_dir, plan=PLAN, graph_backend=backend)


def test_every_step_shape_is_captured_at_start(walker, backend):
    status = walker.runtime.status["cuda_graphs"]
    assert PLAN.request_buckets(24) == (1, 2, 4)
    assert status["captured"] == 6 and status["shapes"][:2] == ["w24xr1p0", "w24xr1p1"]
    assert len(backend.captured) == 6 and walker.runtime.graphs.keys()[-1] == (24, 4, 1)
    batch = walker.runtime.prefill([BeamJob([1, 2, 3], 8, 4), BeamJob([4], 24, 4), BeamJob([5, 6], 2, 4)])
    # fixed shapes: prompts at the plan's bound, three requests at the bucket of four (the
    # padding request: a prompt of one masked key)
    assert (batch.rows, batch.prompt_stride, batch.width) == (4, 40, 24)
    assert batch.prompt_len.tolist() == [3, 1, 2, 1]


@pytest.mark.parametrize("widths,steps", [((24,), 4), ((5, 24), 3), ((1, 9, 24), 4), ((3, 9), 4)])
def test_replayed_steps_match_generate(tiny_dir, walker, backend, widths, steps):
    rng = random.Random(len(widths) * 10 + steps)
    prompts = [_prompt(rng.randrange(1000), rng.randint(1, 40)) for _ in widths]
    replays = sum(c.replays for c in backend.captured)
    # narrower than the bucket: replayed at width 24; three requests: at the bucket of four
    got = walker.run([BeamJob(p, w, steps) for p, w in zip(prompts, widths)])
    assert sum(c.replays for c in backend.captured) == replays + steps - 1  # every decode pass replays
    for out, p, w in zip(got, prompts, widths):
        assert_same_beams(out, hf_beams(tiny_dir, p, w, steps))


def test_replayed_constrained_steps_match_generate(tiny_dir, walker):
    codes = _codes(5, 500, 4, (40, 6, 6, 6))
    prompts = [_prompt(21, 12), _prompt(22, 33)]
    jobs = [BeamJob(prompts[0], 24, 4, build_trie(codes, VOCAB)), BeamJob(prompts[1], 7, 4)]
    got = walker.run(jobs)  # two requests: replayed at the 2-request bucket
    assert_same_beams(got[0], hf_beams(tiny_dir, prompts[0], 24, 4, allowed=codes))
    assert_same_beams(got[1], hf_beams(tiny_dir, prompts[1], 7, 4))


def test_graph_set_replays_by_key():
    class Counter:
        def capture(self, call):
            return Replayed(call, call())

    n = [0]

    def call():
        n[0] += 1
        return ()

    graphs = GraphSet(Counter())
    graphs.capture(("a", 1), call)
    assert ("a", 1) in graphs and ("a", 2) not in graphs and n == [1]
    assert graphs.replay(("a", 1)) == () and n == [2]


def test_gpu_configuration_compiled_here_matches_generate(tiny_dir, tmp_path, monkeypatch):
    """What a GPU serves -- AOT packages, the padded prefill attention, captured steps at the
    plan's prompt bound -- compiled and replayed on the CPU."""
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    plan = BeamPlan(max_requests=2, max_width=12, max_steps=3, max_prompt=32)
    walker = runner(tiny_dir, plan=plan, compile_mode="aot", attention="padded", graph_backend=ReplayByCall())
    status = walker.runtime.status
    assert (status["compile"], status["prefill_attention"], status["cuda_graphs"]["captured"]) == ("aot", "padded", 4)
    prompts = [_prompt(31, 32), _prompt(32, 3)]
    for out, p, w in zip(walker.run([BeamJob(prompts[0], 12, 3), BeamJob(prompts[1], 5, 3)]), prompts, (12, 5)):
        assert_same_beams(out, hf_beams(tiny_dir, p, w, 3))
