"""bench profile: the classes of profiler events (hand-made event trees), and a real profile
of the tiny model whose classes add up to the request's time and whose GEMM work is the
model's."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pytest

from harness.measure import profile as classes
from harness.measure.flops import ModelShape


@dataclass
class Ev:
    name: str
    cpu_time_total: float
    cpu_children: list = field(default_factory=list)
    cpu_parent: Optional["Ev"] = None
    thread: int = 1


def tree(name, total, *children):
    e = Ev(name, total, list(children))
    for c in children:
        c.cpu_parent = e
    return e


def flatten(*roots):
    out = []
    for r in roots:
        out.append(r)
        out.extend(flatten(*r.cpu_children))
    return out


def test_events_are_claimed_once_by_the_first_class_that_claims_them():
    roots = [
        tree("aoti_torch_cpu__linear_pointwise", 10.0),
        tree("bounded::varlen_attention", 7.0, tree("aten::matmul", 3.0, tree("aten::bmm", 3.0)), tree("aten::softmax", 2.0)),
        tree("graph_0_cpp_fused__to_copy_add_mean_mul_pow_rsqrt_0", 4.0),
        tree("graph_0_cpp_fused__softmax_add_1", 1.5),
        # RoPE fused next to the attention op (Inductor names it after its neighbours): elementwise
        tree("graph_0_cpp_fused__to_copy_add_cat_index_mean_mul_neg_pow_rsqrt_varlen_attention_view_1", 2.0),
        tree("graph_1_cpp_fused__unsafe_view_add_amax_arange_bitwise_or_2", 0.5),  # a beam step's masked softmax
        # an int8 plan's activation quantisation (a row amax for the scale): elementwise
        tree("graph_0_cpp_fused__to_copy_abs_add_amax_clamp_div_mean_mul_pow_round_rsqrt_8", 1.0),
        tree("bounded::head", 9.0, tree("mkldnn::_linear_pointwise", 5.0), tree("graph_0_cpp_fused_amax_exp_0", 3.0)),
        tree("bounded::select", 2.0, tree("aten::topk", 1.0), tree("aten::gather", 0.5)),
        # the native fused head: its GEMM (with the softmax statistics as epilogue), then the choice
        tree("bounded::head", 4.0, tree("bounded_native::head_gemm_summary_bf16", 3.0),
             tree("bounded_native::head_choose_bf16", 0.75)),
        tree("aten::matmul", 6.0, tree("aten::mm", 6.0)),  # eager linear: a GEMM
        tree("some python range", 3.0, tree("aten::add", 0.25)),
        tree("bounded_native::swiglu_bf16", 0.5),  # a native elementwise kernel
    ]
    # an op's worker thread: its events run inside the op's, on the model thread
    worker = [tree("aten::bmm", 3.0), tree("aten::softmax", 1.0)]
    for w in worker:
        w.thread = 7
    got = classes.class_times(flatten(*roots) + worker)
    # the op claims its own children; the head's GEMM stays a GEMM; ranges and wrappers add nothing of their own
    assert got.classes == {"gemm": 24.0, "attention": 9.0, "norms_elementwise": 7.75, "head_selection": 5.25}
    assert got.graph_gaps == 0.0


def test_a_compiled_graphs_time_between_its_kernels_is_its_gaps():
    roots = [
        # a package call: 10 us, of which its kernels 4 + 3.5
        tree("bounded::graph", 10.0, tree("aoti_torch_cpu__linear_pointwise", 4.0),
             tree("graph_0_cpp_fused__to_copy_add_mean_mul_pow_rsqrt_0", 3.5)),
        # a package called inside the head's range: all of it the head's (no gap counted twice)
        tree("bounded::head", 6.0, tree("bounded::graph", 5.0, tree("graph_1_cpp_fused_amax_exp_0", 2.0))),
        tree("aten::add", 1.0),  # outside any graph: no gap
    ]
    got = classes.class_times(flatten(*roots))
    assert got.classes == {"gemm": 4.0, "attention": 0.0, "norms_elementwise": 4.5, "head_selection": 5.0}
    assert got.graph_gaps == 2.5


def test_host_parts_split_the_rest_by_the_engines_stage_times():
    parts = classes.host_parts(3.0, {"tokenize": 0.5, "queue": 0.25, "pack": 0.75}, graph_gaps_ms=0.5)
    assert parts == [("check + tokenize", 0.5), ("batching wait", 0.25), ("pack", 0.75),
                     ("graphs, between kernels", 0.5), ("Python between calls", 1.0)]
    assert classes.host_parts(0.5, {"tokenize": 1.0})[-2:] == [("graphs, between kernels", 0.0),
                                                              ("Python between calls", 0.0)]
    # the gaps never exceed what host time has left
    assert classes.host_parts(1.0, {"tokenize": 0.5}, graph_gaps_ms=2.0)[-2:] == [("graphs, between kernels", 0.5),
                                                                                   ("Python between calls", 0.0)]


def test_gemm_work_is_every_layer_gemm_and_the_head(tmp_path):
    from harness.run import profile

    shape = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=100)

    class Item:
        def __init__(self, request, prompt_tokens):
            self.request, self.prompt_tokens = request, prompt_tokens

    from engines.base import BeamRequest, PrefillRequest
    score = Item(PrefillRequest("a", [[1] * 3, [1] * 5], [1, 2]), (3, 5))
    calls = profile._gemm_calls(shape, [score], beam=False)
    # one call per layer GEMM at 8 rows: qkv 8->16, o 8->8, gate_up 8->32, down 16->8
    assert calls == {(8, 8, 16): 2, (8, 8, 8): 2, (8, 8, 32): 2, (8, 16, 8): 2}
    beam = Item(BeamRequest("b", [1] * 6, 4, 3), (6,))
    calls = profile._gemm_calls(shape, [beam], beam=True)
    assert calls[(1, 8, 100)] == 1 and calls[(4, 8, 100)] == 2  # the head: the prompt's last row, then 2 steps of 4
    assert calls[(4, 16, 8)] == 2 * 2  # down: 2 layers x 2 decode passes
    assert sum(2 * m * k * o * n for (m, k, o), n in profile._gemm_calls(shape, [score], False).items()) \
        == 8 * 2 * 2 * (8 * 16 + 8 * 8 + 8 * 32 + 16 * 8)


def test_an_int8_groups_floor_is_at_the_int8_kernels_rate(monkeypatch):
    from engines.base import PrefillRequest
    from harness.run import profile

    shape = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=100)

    class Item:
        def __init__(self, request, prompt_tokens):
            self.request, self.prompt_tokens = request, prompt_tokens

    rates = {"dense": 1e12, "int8": 4e12}
    seen = []
    monkeypatch.setattr(profile, "_isolated_rate", lambda m, k, o, dtype, kind="dense": seen.append((k, o, kind))
                        or rates[kind])
    monkeypatch.setattr(profile, "_bandwidth", lambda: 1e10)
    items = [Item(PrefillRequest("a", [[1] * 3, [1] * 5], [1, 2]), (3, 5))]
    work = profile._work(shape, items, "bfloat16", 1.0, kinds={"gate_up": "int8", "down": "int8"})
    # 8 rows, 2 layers: qkv 8->16 and o 8->8 dense, gate_up 8->32 and down 16->8 int8
    dense, low = 2 * 8 * 2 * (8 * 16 + 8 * 8), 2 * 8 * 2 * (8 * 32 + 16 * 8)
    assert work["gemm"][2] == pytest.approx((dense / 1e12 + low / 4e12) * 1000.0)
    assert sorted(seen) == [(8, 8, "dense"), (8, 16, "dense"), (8, 32, "int8"), (16, 8, "int8")]


def test_a_fused_heads_floor_is_its_flops_at_peak_or_its_weight_read(monkeypatch):
    """The fused head writes no logits: its floor is not a library GEMM's (which writes [rows,
    V] of them) but the longer of its FLOPs at the peak rate and its weight read once a call."""
    from engines.base import BeamRequest
    from harness.run import profile

    shape = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=100)

    class Item:
        def __init__(self, request, prompt_tokens):
            self.request, self.prompt_tokens = request, prompt_tokens

    seen = []
    monkeypatch.setattr(profile, "_isolated_rate", lambda m, k, o, dtype, kind="dense": seen.append((k, o)) or 1e12)
    monkeypatch.setattr(profile, "_bandwidth", lambda: 1e6)  # 1 MB/s: the weight read is the longer
    items = [Item(BeamRequest("b", [1] * 6, 4, 3), (6,))]
    layers = sum(2 * m * k * o * t for (m, k, o), t in profile._gemm_calls(shape, items, True).items()
                 if o != shape.vocab)
    fused = profile._work(shape, items, "bfloat16", 1.0, fused_head=True)["gemm"][2]
    # the head runs 3 times (the prompt's row, then 2 steps of 4 rows), reading 8 x 100 bf16 each
    assert fused == pytest.approx((layers / 1e12 + 3 * 8 * 100 * 2 / 1e6) * 1000.0)
    assert (8, 100) not in seen
    plain = profile._work(shape, items, "bfloat16", 1.0)["gemm"][2]  # logits written: the library's rate
    assert plain == pytest.approx((layers + 2 * 8 * 100 * (1 + 2 * 4)) / 1e12 * 1000.0) and (8, 100) in seen
    monkeypatch.setattr(profile, "_bandwidth", lambda: 1e15)  # now the FLOPs at the 1 TFLOP/s peak
    assert profile._work(shape, items, "bfloat16", 1.0, fused_head=True)["gemm"][2] == pytest.approx(plain)


def test_the_int8_isolated_rate_runs_on_an_int8_weight(monkeypatch):
    from engines.bounded.kernels import int8
    from harness.run import profile

    packed, real = [], int8.prepack
    monkeypatch.setattr(int8, "prepack", lambda w: packed.append((tuple(w.shape), w.dtype)) or real(w))
    assert profile._isolated_rate(64, 256, 512, "bfloat16", "int8") > 0
    assert packed == [((512, 256), __import__("torch").int8)]  # (oneDNN's u8 x s8 kernel where it packs)


def test_a_profile_of_the_tiny_model_adds_up_to_its_requests(tmp_path, tiny_dir):
    from harness.run import profile
    from harness.scenario.files import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(
        "name: p\nmodel: tiny\ndtype: float32\ntask: {kind: prefill_only, labels: [' yes', ' no']}\n"
        "workload: {samples_per_request: 4, prompt_tokens: {mean: 24, min: 8, max: 48}, seed: 0}\n"
        "bounds: {max_samples_per_request: 8, max_prompt_tokens: 64}\n"
        "load: {mode: closed, concurrency: [1], requests: 4, warmup_requests: 2}\n"
        "engines: [{name: bounded, compile: eager}]\n")
    p = profile.profile_scenario(load_scenario(path), "bounded", 4, "cpu", log=lambda m: None)
    rows = {r.name: r for r in p.rows}
    top = [r for r in p.rows if not r.name.startswith("host: ")]
    assert [r.name for r in top] == list(classes.CLASSES)
    assert sum(r.ms for r in top) == pytest.approx(p.request_ms, rel=0.02)
    assert sum(r.ms for r in p.rows if r.name.startswith("host: ")) == pytest.approx(rows["host"].ms, abs=0.01)
    assert rows["gemm"].ms > 0 and rows["attention"].ms > 0 and rows["norms_elementwise"].ms > 0
    assert rows["gemm"].floor_ms is not None and "GFLOP" in rows["gemm"].work
    assert rows["host: graphs, between kernels"].ms == 0.0  # eager: no compiled package
    written = profile.write(p, tmp_path / "out")
    assert [f.name for f in written] == ["profile.json", "profile.csv", "profile.html"]
    assert "Where a request" in (tmp_path / "out" / "profile.html").read_text()
