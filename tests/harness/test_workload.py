import json

import numpy as np
import pytest

from engines.base import BeamRequest, PrefillRequest
from harness.scenario import parse_scenario
from harness.workload import SyntheticWorkload, build_workload, read_jsonl


def _scenario(**workload):
    return parse_scenario(dict(
        name="t", model="tiny", task={"kind": "prefill_only", "labels": [" yes", " no"]},
        workload={"samples_per_request": 5, "prompt_tokens": {"mean": 60, "min": 20, "max": 100}, **workload},
        load={"mode": "closed", "concurrency": [1]}, engines=["noop"]))


def test_same_seed_same_requests_in_same_order(tokenizer):
    a, b = build_workload(_scenario(), tokenizer), build_workload(_scenario(), tokenizer)
    b.prefetch(7)
    assert [a[i] for i in range(10)] == [b[i] for i in range(10)]
    c = build_workload(_scenario(seed=1), tokenizer)
    assert a[0].request.samples != c[0].request.samples


def test_text_has_exactly_the_drawn_token_count(tokenizer):
    wl = build_workload(_scenario(), tokenizer)
    for i in range(20):
        item = wl[i]
        assert isinstance(item.request, PrefillRequest)
        got = [len(tokenizer.encode(s, add_special_tokens=False)) for s in item.request.samples]
        assert got == list(item.prompt_tokens)


def test_lengths_follow_the_distribution(tokenizer):
    wl = build_workload(_scenario(), tokenizer)
    lengths = np.array([n for i in range(400) for n in wl[i].prompt_tokens])
    assert lengths.min() >= 20 and lengths.max() <= 100
    assert abs(lengths.mean() - 60) < 2
    assert 15 < lengths.std() < 25  # default std = range / 4 = 20, less a little for clipping


def test_beam_workload_with_item_codes(tokenizer):
    sc = parse_scenario(dict(
        name="b", model="tiny", task={"kind": "beam_search", "beam_width": 4, "decode_steps": 3,
                                      "item_codes": {"count": 500, "length": 3}},
        workload={"prompt_tokens": 12}, load={"mode": "closed", "concurrency": [1]}, engines=["noop"]))
    wl = SyntheticWorkload(sc, tokenizer)
    r0, r1 = wl[0].request, wl[1].request
    assert isinstance(r0, BeamRequest) and r0.beam_width == 4 and wl[0].prompt_tokens == (12,)
    assert r0.allowed is r1.allowed and len(set(r0.allowed)) == 500
    assert all(len(c) == 3 for c in r0.allowed)


def test_jsonl_dataset(tmp_path, tokenizer):
    p = tmp_path / "reqs.jsonl"
    p.write_text("\n".join(json.dumps(o) for o in [
        {"id": "a", "kind": "prefill_only", "samples": [" hello world", [1, 2, 3]], "labels": [" yes", 902]},
        {"id": "b", "kind": "beam_search", "prompt": [5, 6], "beam_width": 3, "decode_steps": 2,
         "allowed": [[1, 2], [1, 3]]},
    ]))
    sc = _scenario(prompt_tokens=None, dataset=str(p))
    wl = build_workload(sc, tokenizer)
    assert wl[0].prompt_tokens == (2, 3) and wl[1].prompt_tokens == (2,) and wl[2] == wl[0]
    assert wl[1].request.allowed == ((1, 2), (1, 3))


def test_jsonl_errors_name_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": 1, "kind": "prefill_only", "samples": ["x"], "labels": [" a"]}\n{"kind": "beam_search"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: missing field 'prompt'"):
        read_jsonl(p)
    p.write_text("{oops\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not valid JSON"):
        read_jsonl(p)
