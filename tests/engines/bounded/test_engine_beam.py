"""The bounded engine serving beam_search end to end: concurrent business requests (text
or token prompts, with or without item codes) batched into shared decode steps, against
transformers `generate`; bounds; stages. (The compiled graphs: runtime/test_compiled.py.)"""
from __future__ import annotations

import asyncio

import pytest

from engines.base import BeamRequest, BeamResult, Bounds, EngineConfig, RequestRejected
from engines.bounded.engine import BoundedEngine
from engines.bounded.runtime.beam_batch import BeamOutput

from .beam_reference import assert_same_beams, hf_beams
from .conftest import VOCAB
from .tasks.test_beam import _codes, _prompt

BOUNDS = Bounds(max_samples_per_request=1, max_prompt_tokens=300, max_beam_width=40, max_decode_steps=4)


def start(model_dir, dtype="float32", bounds=BOUNDS, **options):
    options.setdefault("compile", "eager")
    engine = BoundedEngine(EngineConfig(model_dir, dtype, "cpu", bounds, "beam_search", options))
    engine.start()
    return engine


async def gather(engine, requests):
    return await asyncio.gather(*(engine.submit(r) for r in requests), return_exceptions=True)


def output(res: BeamResult) -> BeamOutput:
    assert not isinstance(res, BaseException), res
    return BeamOutput([b.token_ids for b in res.beams], [b.logprob for b in res.beams])


def requests(codes) -> list[BeamRequest]:
    return [BeamRequest("text", " the quick brown fox jumps over the lazy dog", 40, 4),
            BeamRequest("long", _prompt(11, 300), 37, 4),
            BeamRequest("codes", _prompt(12, 20), 16, 4, codes),
            BeamRequest("greedy", _prompt(13, 1), 1, 4)]


@pytest.fixture(scope="module")
def engine(tiny_dir):
    e = start(tiny_dir, max_wait_ms=200, max_batch_beams=160)
    yield e
    e.stop()


def test_concurrent_requests_share_steps_and_match_transformers(tiny_dir, engine, tokenizer):
    codes = _codes(5, 2000, 4, (120, 10, 10, 10))
    reqs = requests(codes)
    results = asyncio.run(gather(engine, reqs))
    assert engine.describe().details["stats"]["largest_batch"] == len(reqs)  # one execution for all four
    for req, res in zip(reqs, results):
        prompt = tokenizer.encode(req.prompt) if isinstance(req.prompt, str) else req.prompt
        got = output(res)
        assert_same_beams(got, hf_beams(tiny_dir, prompt, req.beam_width, req.decode_steps, req.allowed))
        assert [b.text for b in res.beams] == tokenizer.batch_decode(got.tokens)
        assert list(res.stages) == ["tokenize", "queue", "prefill", "step1", "step2", "step3", "step4",
                                    "format"]


def test_fewer_steps_than_the_bound_and_bad_requests_fail_alone(tiny_dir, engine):
    reqs = [BeamRequest("ok", [5, 6, 7], 8, 2), BeamRequest("wide", [5], 41, 2),
            BeamRequest("steps", [5], 4, 5), BeamRequest("long", [5] * 301, 4, 2),
            BeamRequest("vocab", [VOCAB], 4, 2), BeamRequest("codes", [5], 4, 2, ((1, VOCAB),))]
    ok, *bad = asyncio.run(gather(engine, reqs))
    assert_same_beams(output(ok), hf_beams(tiny_dir, [5, 6, 7], 8, 2))
    assert all(isinstance(e, RequestRejected) for e in bad), bad
    assert "beam_width: 41 outside 1..40" in str(bad[0]) and f"allowed.0: token id {VOCAB} outside" in str(bad[4])


def test_describe_names_the_beam_dag(engine):
    d = engine.describe().details
    assert d["serves"] == ["beam_search"] and d["beam_search"]["plan"]["max_requests"] == 4
    assert d["beam_search"]["dag"]["batch"] == ["prefill", "step1", "step2", "step3", "step4", "format"]


def test_warm_up_runs_the_full_batch_and_a_lone_request(engine, monkeypatch):
    task = engine.tasks["beam_search"]
    ran = []
    monkeypatch.setattr(task, "run", lambda jobs, stages: ran.append((len(jobs), jobs[0].width, jobs[0].steps)))
    task.warm_up()
    p = task.plan  # the planned batch's shapes, then concurrency 1's (oneDNN builds kernels per row count)
    assert ran == [(p.max_requests, p.max_width, p.max_steps), (1, p.max_width, p.max_steps)]
