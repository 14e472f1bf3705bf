"""The accuracy gate: a plan further from float32 than bf16 is refused with its groups named
(or served when the option accepts it), for scoring and for beams; the verdict is cached."""
from __future__ import annotations

import pytest

from engines.base import Bounds, PrefillRequest
from engines.bounded.kernels import int8
from engines.bounded.tasks.gate import Distance, PlanRefused
from engines.hardware import onednn_int8_exact

from .. import test_engine, test_engine_beam

# an int8 plan is refused outright on a CPU without VNNI or AMX (model/precision.py)
needs_int8 = pytest.mark.skipif(not onednn_int8_exact(), reason="int8 GEMMs need VNNI or AMX")
SMALL = Bounds(max_samples_per_request=8, max_prompt_tokens=64, max_beam_width=8, max_decode_steps=3)


@pytest.fixture
def coarse_int8(monkeypatch, tmp_path, tiny_dir):
    """int8 GEMMs with 3 levels (-1, 0, 1) instead of 255: far further from float32 than bf16."""
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))  # a fresh verdict cache (tiny_dir is made)
    monkeypatch.setattr(int8, "QMAX", 1.0)
    return tiny_dir


def test_distance_worse_than():
    bf16 = Distance(0.01, 0.05, 0.99)
    assert Distance(0.01, 0.5, 0.99).worse_than(bf16) == []  # the max is reported, not judged
    assert Distance(0.02, 0.05, 1.0).worse_than(bf16) == ["error 0.02 > bf16's 0.01"]
    assert Distance(0.001, 0.01, 0.98).worse_than(bf16) == ["agreement 98.0% < bf16's 99.0%"]
    assert Distance(0.02, 0.05, 1.0).worse_than(bf16, judge_error=False) == []
    beams = Distance(9.0, 9.0, 0.9, error_judged=False)
    assert beams.worse_than(Distance(0.1, 0.1, 0.9)) == []


@needs_int8
def test_scoring_plan_further_than_bf16_is_refused_naming_its_groups(coarse_int8):
    with pytest.raises(PlanRefused) as e:
        test_engine.start(coarse_int8, "float32", SMALL, int8=["gate_up", "down"])
    msg = str(e.value)
    assert "float32 + int8 [down, gate_up] (down=int8, gate_up=int8) is further from float32 than bf16" in msg
    assert "prefill_only calibration batch" in msg and "gate: accept" in msg


@needs_int8
def test_accepted_plan_serves_and_reports_the_verdict(coarse_int8):
    engine = test_engine.start(coarse_int8, "float32", SMALL, int8=["down"], gate="accept")
    try:
        verdict = engine.describe().details["precision_policy"]["accuracy_gate"]["prefill_only"]
        assert verdict["passed"] is False and verdict["accepted"] is True and verdict["cached"] is False
        mine, bf16 = verdict["plan_vs_float32"], verdict["bfloat16_vs_float32"]
        assert mine["error"] > bf16["error"] > 0
        res = test_engine.asyncio.run(engine.submit(PrefillRequest("r", [[1, 2, 3]], [5, 6])))
        assert len(res.scores) == 1
    finally:
        engine.stop()
    again = test_engine.start(coarse_int8, "float32", SMALL, int8=["down"], gate="accept")
    assert again.describe().details["precision_policy"]["accuracy_gate"]["prefill_only"]["cached"] is True
    again.stop()


@needs_int8
def test_beam_plan_further_than_bf16_is_refused(coarse_int8):
    with pytest.raises(PlanRefused, match=r"int8 \[gate_up, head\].*beam_search calibration batch"):
        test_engine_beam.start(coarse_int8, "float32", SMALL, int8=["gate_up", "head"])


@needs_int8
def test_dense_plans_are_not_judged(tiny_dir):
    engine = test_engine.start(tiny_dir, "float32", SMALL)
    assert engine.describe().details["precision_policy"]["accuracy_gate"].startswith("not needed")
    engine.stop()
    beam_head_only = test_engine.start(tiny_dir, "float32", SMALL, int8=["head"])  # scoring never runs the head
    assert isinstance(beam_head_only.describe().details["precision_policy"]["accuracy_gate"], str)
    beam_head_only.stop()


def test_gate_modes_judge_error_and_decisions_or_decisions_alone(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from engines.bounded.model.precision import PrecisionPolicy
    from engines.bounded.tasks import gate

    bf16 = Distance(0.0016, 0.005, 1.0)
    same_labels = gate.Verdict("prefill_only", "bfloat16 + int8 [down]", Distance(0.0065, 0.02, 1.0), bf16, 1.0)
    flipped = gate.Verdict("prefill_only", "bfloat16 + int8 [down]", Distance(0.0065, 0.02, 0.9), bf16, 1.0)
    verdicts = iter([same_labels, flipped])
    paths = iter([tmp_path / "a.json", tmp_path / "a.json", tmp_path / "b.json"])
    monkeypatch.setattr(gate, "cache_path", lambda task: next(paths))
    monkeypatch.setattr(gate, "judge", lambda *a: next(verdicts))
    policy, task = PrecisionPolicy("bfloat16", gemm={"down": "int8"}), SimpleNamespace(kind="prefill_only")
    with pytest.raises(PlanRefused, match=r"error 0.0065 > bf16's 0.0016.*gate: decisions"):
        gate.check(task, None, policy, "refuse", lambda m: None)
    out = gate.check(task, None, policy, "decisions", lambda m: None)  # the same plan, its verdict cached
    assert out["passed"] and out["cached"] and not out["accepted"] and out["mode"] == "decisions"
    with pytest.raises(PlanRefused, match=r"agreement 90.0% < bf16's 100.0%"):
        gate.check(task, None, policy, "decisions", lambda m: None)


def test_the_cached_verdict_is_keyed_by_how_the_plan_is_served(monkeypatch, tmp_path):
    """An eager (fallen-back) plan runs other int8 kernels than its AOT package: its own verdict."""
    from types import SimpleNamespace

    from engines.bounded.tasks import gate

    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    export = SimpleNamespace(name="score_prefill", shapes={})
    key = SimpleNamespace(digest=lambda: "abc")

    def task(mode):
        rt = SimpleNamespace(exports=lambda: [export], key=lambda name, shapes: key, status={"compile": mode},
                             policy=SimpleNamespace(gemm_kind=lambda group: "int8"))
        return SimpleNamespace(kind="prefill_only", runtime=rt)

    assert gate.cache_path(task("aot")) == gate.cache_path(task("aot"))
    assert gate.cache_path(task("aot")) != gate.cache_path(task("eager"))
