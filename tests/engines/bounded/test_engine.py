"""The bounded engine end to end (eager graph): label probabilities against transformers,
cross-request batching, bounds, stages."""
from __future__ import annotations

import asyncio
import platform
import random

import pytest
import torch

from engines.base import BeamRequest, Bounds, EngineConfig, EngineError, Precision, PrefillRequest, RequestRejected
from engines.bounded.engine import BoundedEngine

from .conftest import random_seqs, reference

BOUNDS = Bounds(max_samples_per_request=16, max_prompt_tokens=500)


def start(model_dir, dtype="float32", bounds=BOUNDS, **options):
    options.setdefault("compile", "eager")
    engine = BoundedEngine(EngineConfig(model_dir, dtype, "cpu", bounds, "prefill_only", options))
    engine.start()
    return engine


async def gather(engine, requests):
    return await asyncio.gather(*(engine.submit(r) for r in requests), return_exceptions=True)


def random_requests(rng, n, max_samples=16, hi=500):
    return [PrefillRequest(f"r{i}", random_seqs(rng, rng.randint(1, max_samples), 1, hi),
                           rng.sample(range(151936), rng.randint(2, 4))) for i in range(n)]


def compare(model_dir, requests, results, dtype=torch.float32):
    """-> per-sample max abs error [samples], top-label agreement [samples] vs transformers."""
    ref = reference(model_dir, dtype)
    errs, agree = [], []
    for req, res in zip(requests, results):
        assert not isinstance(res, BaseException), res
        got = torch.tensor(res.scores)
        want = ref.scores(req.samples, req.labels)
        assert got.shape == want.shape
        errs.append((got - want).abs().max(-1).values)
        agree.append(got.argmax(-1) == want.argmax(-1))
    return torch.cat(errs), torch.cat(agree).float()


def thousand_samples(seed: int) -> list[PrefillRequest]:
    """Requests of 1-16 samples of 1-500 tokens, 1,000 samples or a few more in all."""
    rng, requests = random.Random(seed), []
    while sum(len(r.samples) for r in requests) < 1000:
        requests += random_requests(rng, 1)
    return [PrefillRequest(f"r{i}", r.samples, r.labels) for i, r in enumerate(requests)]


def submit_in_waves(engine, requests, wave=8):
    """`wave` requests at a time, concurrently, so the batcher merges them."""
    results = []
    for i in range(0, len(requests), wave):
        results += asyncio.run(gather(engine, requests[i:i + wave]))
    return results


def test_float32_matches_transformers_on_1000_samples(preset_dir):
    engine = start(preset_dir, max_wait_ms=1000)  # a long wait, so each wave surely merges
    try:
        requests = thousand_samples(1)
        results = submit_in_waves(engine, requests)
        stats = dict(engine.stats)
    finally:
        engine.stop()
    errs, agree = compare(preset_dir, requests, results)
    assert len(errs) >= 1000
    assert errs.max().item() < 1e-4
    assert agree.mean().item() >= 0.99
    assert stats["batches"] < len(requests), "concurrent requests were not batched together"
    assert stats["largest_batch"] > 1


def test_bfloat16_matches_float32_transformers_within_2e2(calm_dir):
    engine = start(calm_dir, "bfloat16", max_wait_ms=50, precision="bfloat16")  # bf16 on any CPU
    try:
        requests = thousand_samples(2)
        results = submit_in_waves(engine, requests)
    finally:
        engine.stop()
    errs, agree = compare(calm_dir, requests, results)
    assert len(errs) >= 1000
    assert errs.max().item() < 2e-2
    assert agree.mean().item() >= 0.99


def test_bfloat16_no_worse_than_transformers_bf16(preset_dir):
    """On the presets' large weights bf16 rounding alone moves label probabilities by up to
    ~0.5 (tiny-qwen2) in transformers' own bf16, so no fixed bound holds there (see
    calm_dir); we require our bf16 to be as close to the float32 reference as transformers'
    bf16 is. Over 30 requests (~250 samples): on 10, the 90th percentiles of the two sets of
    rounding errors differed by up to 1.33x either way from seed to seed (Zen 3, bf16
    emulated), equal means throughout."""
    engine = start(preset_dir, "bfloat16", max_wait_ms=50, precision="bfloat16")
    try:
        rng = random.Random(2)
        requests = random_requests(rng, 30, hi=150)
        results = asyncio.run(gather(engine, requests))
    finally:
        engine.stop()
    errs, agree = compare(preset_dir, requests, results)
    hf_errs, hf_agree = compare(preset_dir, requests, [_hf_bf16(preset_dir, r) for r in requests])
    assert errs.mean().item() <= 1.25 * hf_errs.mean().item() + 2e-3
    assert torch.quantile(errs, 0.9).item() <= 1.25 * torch.quantile(hf_errs, 0.9).item() + 2e-3
    assert errs.mean().item() < 3e-2
    assert agree.mean().item() >= min(0.99, hf_agree.mean().item()) - 0.02


def _hf_bf16(model_dir, req):
    from engines.base import PrefillResult

    return PrefillResult(req.id, reference(model_dir, torch.bfloat16).scores(req.samples, req.labels).tolist())


def test_text_samples_and_string_labels(tiny_engine):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_engine.config.model_dir))
    req = PrefillRequest("t", ["Is this relevant to shoes?", "red running shoes for men"], [" yes", " no"])
    res = asyncio.run(tiny_engine.submit(req))
    ids = [tok.encode(s, add_special_tokens=False) for s in req.samples]
    labels = [tok.encode(l, add_special_tokens=False)[0] for l in req.labels]
    want = reference(tiny_engine.config.model_dir).scores(ids, labels)
    assert (torch.tensor(res.scores) - want).abs().max().item() < 1e-4


def test_bad_requests_fail_alone(tiny_engine):
    rng = random.Random(3)
    good = random_requests(rng, 3, max_samples=4, hi=60)
    bad = [
        PrefillRequest("long", [[5] * 61], [1, 2]),  # past max_prompt_tokens
        PrefillRequest("many", [[5]] * 5, [1, 2]),  # past max_samples_per_request
        PrefillRequest("label", [[5, 6]], [" definitely not one token", " no"]),
        PrefillRequest("vocab", [[5, 10**7]], [1, 2]),
        PrefillRequest("empty", [[]], [1, 2]),
    ]
    mixed = good[:1] + bad + good[1:]
    results = asyncio.run(gather(tiny_engine, mixed))
    by_id = {r.id: res for r, res in zip(mixed, results)}
    for r in bad:
        assert isinstance(by_id[r.id], RequestRejected), (r.id, by_id[r.id])
    assert "max_prompt_tokens 60" in str(by_id["long"])
    assert "max_samples_per_request 4" in str(by_id["many"])
    errs, _ = compare(tiny_engine.config.model_dir, good, [by_id[r.id] for r in good])
    assert errs.max().item() < 1e-4
    # and the engine keeps serving
    assert not isinstance(asyncio.run(gather(tiny_engine, good[:1]))[0], BaseException)


def test_failing_batch_isolates_the_culprit(tiny_engine, monkeypatch):
    real_run = tiny_engine.tasks["prefill_only"].runtime.run
    poison = 77

    def run(batch, labels):
        if (batch.tokens == poison).any():
            raise RuntimeError("kernel failure")
        return real_run(batch, labels)

    monkeypatch.setattr(tiny_engine.tasks["prefill_only"].runtime, "run", run)
    reqs = [PrefillRequest("a", [[1, 2, 3]], [1, 2]), PrefillRequest("p", [[poison]], [1, 2]),
            PrefillRequest("b", [[4, 5]], [1, 2])]
    a, p, b = asyncio.run(gather(tiny_engine, reqs))
    assert isinstance(p, EngineError) and "kernel failure" in str(p)
    assert not isinstance(a, BaseException) and not isinstance(b, BaseException)


def test_the_engine_starts_and_runs_on_its_model_thread(tiny_dir_f32, monkeypatch):
    """Loading, warm-up and every call on one thread, not the caller's: the caller opens no
    OpenMP team of its own (tasks/batcher.py)."""
    import threading

    from engines.bounded.tasks.prefill import PrefillTask

    threads = {"start": set(), "run": set()}
    real_start, real_run = PrefillTask.start, PrefillTask.run

    def start_(self, *a, **k):
        threads["start"].add(threading.get_ident())
        return real_start(self, *a, **k)

    def run_(self, *a, **k):
        threads["run"].add(threading.get_ident())
        return real_run(self, *a, **k)

    monkeypatch.setattr(PrefillTask, "start", start_)
    monkeypatch.setattr(PrefillTask, "run", run_)
    monkeypatch.delenv("BOUNDED_MALLOC", raising=False)
    engine = start(tiny_dir_f32)
    try:
        out = asyncio.run(gather(engine, [PrefillRequest("a", [[1, 2, 3]], [1, 2])]))
        # while it runs on a CPU, freed memory stays in the process (runtime/memory.py)
        held = engine._memory.active or platform.libc_ver()[0] != "glibc"
    finally:
        engine.stop()
    assert held and not engine._memory.active
    assert not isinstance(out[0], BaseException)
    assert threads["start"] == threads["run"] and len(threads["run"]) == 1
    assert threading.get_ident() not in threads["run"]


def test_a_task_that_fails_to_start_fails_the_engine_start(tiny_dir_f32, monkeypatch):
    from engines.bounded.runtime import memory
    from engines.bounded.tasks.prefill import PrefillTask

    def broken(self, *a, **k):
        raise RuntimeError("package unreadable")

    monkeypatch.setattr(PrefillTask, "start", broken)
    holders = memory._holders
    with pytest.raises(RuntimeError, match="package unreadable"):
        start(tiny_dir_f32)
    assert memory._holders == holders  # the failed start let go of malloc's setting


def test_truncate_mode(tiny_dir_f32):
    bounds = Bounds(max_samples_per_request=2, max_prompt_tokens=8, on_violation="truncate")
    engine = start(tiny_dir_f32, bounds=bounds)
    try:
        seqs = [list(range(100, 120)), [7, 8, 9], [1, 2]]
        res = asyncio.run(engine.submit(PrefillRequest("t", seqs, [3, 4])))
    finally:
        engine.stop()
    want = reference(tiny_dir_f32).scores([seqs[0][-8:], seqs[1]], [3, 4])  # the end is kept
    assert len(res.scores) == 2
    assert (torch.tensor(res.scores) - want).abs().max().item() < 1e-4


def test_stages_and_beam_rejection(tiny_engine):
    res = asyncio.run(tiny_engine.submit(PrefillRequest("s", [[1, 2, 3]], [1, 2])))
    assert list(res.stages) == ["tokenize", "queue", "pack", "prefill", "score", "format"]
    assert all(v >= 0 for v in res.stages.values())
    with pytest.raises(RequestRejected, match="started for prefill_only, not beam_search"):
        asyncio.run(tiny_engine.submit(BeamRequest("b", [1, 2], beam_width=4, decode_steps=2)))
    d = tiny_engine.describe()
    assert d.engine == "bounded" and d.mode == "eager" and d.fallback is None and d.dtype == "float32"
    assert d.precision == Precision("float32", "float32", d.precision.why) and d.cuda_graphs == "not used"
    assert d.plan.startswith("prefill ") and d.details["prefill_only"]["status"]["compile"] == "eager"
    d = d.details
    assert d["bounds"]["max_prompt_tokens"] == 60 and d["batching"]["max_wait_ms"] == 0.0
    assert d["memory"].startswith("huge pages: ")  # collapsed, or why not (runtime/hugepages.py)
    assert d["serves"] == ["prefill_only"] and d["prefill_only"]["dag"] == {
        "request": ["tokenize"], "batch": ["pack", "prefill", "score", "format"]}


def test_unknown_option_lists_known_ones(tiny_dir_f32):
    from engines.base import EngineUnavailable

    cfg = EngineConfig(tiny_dir_f32, options={"compiel": "aot"})
    with pytest.raises(EngineUnavailable, match="known options: compile, max_wait_ms"):
        BoundedEngine.check_available(cfg)
    with pytest.raises(ValueError, match="known options: compile, max_wait_ms"):  # at scenario load
        BoundedEngine.check_options({"compiel": "aot"})
    BoundedEngine.check_options({"compile": "eager", "max_wait_ms": 1})


@pytest.fixture(scope="module")
def tiny_dir_f32():
    from harness.workload.presets import materialise

    return materialise("tiny", log=lambda s: None)


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir_f32):
    engine = start(tiny_dir_f32, bounds=Bounds(max_samples_per_request=4, max_prompt_tokens=60))
    yield engine
    engine.stop()


def test_calls_are_rounded_to_a_token_bucket_by_an_unscored_filler(tiny_dir_f32):
    from engines.bounded.runtime.buffers import TOKEN_BUCKET
    from engines.bounded.tasks.prefill import ScoreItem

    engine = start(tiny_dir_f32, bounds=Bounds(max_samples_per_request=4, max_prompt_tokens=40))
    try:
        task = engine.tasks["prefill_only"]
        rng = random.Random(5)
        items = [ScoreItem(f"r{i}", random_seqs(rng, 3, 1, 40), [5, 9]) for i in range(4)]
        for it in items:
            batch = task.pack([it])
            assert batch.packed.num_tokens % TOKEN_BUCKET == 0 or batch.packed.num_seqs == 3
            assert batch.rows == [(0, 3)]  # the filler (a 4th sequence) is never scored
        # the answers are those of the samples alone
        req = [PrefillRequest(it.id, it.seqs, it.label_ids) for it in items]
        results = asyncio.run(gather(engine, req))
        errs, agree = compare(tiny_dir_f32, req, results)
        assert errs.max() < 1e-5 and agree.min() == 1
        # no room for a filler: the call runs as it is
        assert task._filler(task.plan.max_tokens - 1, 1) == 1  # 160 tokens: still within the budget
        assert task._filler(33, task.plan.max_seqs) == 0  # no room for one more sequence
        assert task._filler(33, 1) == TOKEN_BUCKET - 1 and task._filler(64, 1) == 0
    finally:
        engine.stop()
