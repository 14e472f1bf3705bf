import json

import numpy as np
import pytest

from engines.base import BeamRequest, PrefillRequest
from harness.scenario.files import parse_scenario
from harness.workload.requests import SyntheticWorkload, build_workload, read_jsonl


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
        {"id": "b", "kind": "beam_search", "prompt": [5, 6], "beam_width": 2, "decode_steps": 2,
         "allowed": [[1, 2], [1, 3]]},
    ]))
    sc = _scenario(prompt_tokens=None, dataset=str(p))
    wl = build_workload(sc, tokenizer)
    assert wl[0].prompt_tokens == (2, 3) and wl[1].prompt_tokens == (2,) and wl[2] == wl[0]
    assert wl[1].request.allowed == ((1, 2), (1, 3))


def test_jsonl_errors_name_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": 1, "kind": "prefill_only", "samples": ["x"], "labels": [" a"]}\n{"kind": "beam_search"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: missing field 'beam_width'"):
        read_jsonl(p)
    p.write_text("{oops\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not valid JSON"):
        read_jsonl(p)


def _query_scenario(**workload):
    wl = {"query_tokens": {"mean": 32, "min": 8, "max": 64}, "item_tokens": {"mean": 20, "min": 4, "max": 40},
          "items_per_request": {"mean": 6, "min": 1, "max": 12}, **workload}
    return parse_scenario(dict(name="q", model="tiny", task={"kind": "prefill_only", "labels": [" yes", " no"]},
                               workload=wl, load={"mode": "closed", "concurrency": [1]}, engines=["noop"]))


def test_query_workload_is_deterministic_with_exact_lengths(tokenizer):
    a, b = build_workload(_query_scenario(), tokenizer), build_workload(_query_scenario(), tokenizer)
    assert [a[i] for i in range(5)] == [b[i] for i in range(5)]
    counts = set()
    for i in range(30):
        item, req = a[i], a[i].request
        assert req.has_query and req.samples == () and len(req.items) == len(item.prompt_tokens)
        q = len(tokenizer.encode(req.query, add_special_tokens=False))
        assert q == item.query_tokens and 8 <= q <= 64
        # each sample's tokens are the whole concatenation, tokenized as one string
        assert [len(tokenizer.encode(req.query + it, add_special_tokens=False)) for it in req.items] == \
            list(item.prompt_tokens)
        assert all(q + 4 <= n <= q + 40 for n in item.prompt_tokens)
        counts.add(len(req.items))
    assert len(counts) > 3 and min(counts) >= 1 and max(counts) <= 12  # items per request drawn
    fixed = build_workload(_query_scenario(items_per_request=15), tokenizer)
    assert all(len(fixed[i].request.items) == 15 for i in range(5))


def test_query_jsonl_dataset(tmp_path, tokenizer):
    p = tmp_path / "q.jsonl"
    p.write_text("\n".join(json.dumps(o) for o in [
        {"id": "t", "kind": "prefill_only", "query": " is it", "items": [" red", " a big cat"], "labels": [" yes", " no"]},
        {"id": "i", "kind": "prefill_only", "query": [1, 2, 3], "items": [[4], [5, 6]], "labels": [7, 8]},
    ]))
    wl = build_workload(_scenario(prompt_tokens=None, dataset=str(p)), tokenizer)
    assert wl[0].request.query == " is it" and wl[0].prompt_tokens == (3, 5) and wl[0].query_tokens == 2
    assert wl[1].prompt_tokens == (4, 5) and wl[1].query_tokens == 3


@pytest.mark.parametrize("line, msg", [
    ({"query": " q", "items": [], "labels": [1, 2]}, "items: need at least one item"),
    ({"query": " q", "items": " a", "labels": [1, 2]}, "items: expected a list of items"),
    ({"query": " q", "items": [[1]], "labels": [1, 2]}, "items.0: expected text like the query"),
    ({"query": [1], "items": [" a"], "labels": [1, 2]}, "items.0: expected a list of token ids, got str"),
    ({"query": [1.5], "items": [[1]], "labels": [1, 2]}, "query.0: token ids are integers, got 1.5"),
    ({"query": [], "items": [[1]], "labels": [1, 2]}, "query: empty"),
    ({"query": [1], "items": [[True]], "labels": [1, 2]}, "items.0.0: token ids are integers, got True"),
    ({"query": [1], "items": [[1]], "samples": [[1]], "labels": [1, 2]}, "not both"),
    ({"query": [1], "labels": [1, 2]}, "missing field 'items'"),
])
def test_query_jsonl_errors_name_line_and_field(tmp_path, tiny_dir, tokenizer, line, msg):
    """A query line's shape is judged by the reader, its fields by the engines' shared check."""
    from harness.run.infer import caps_checker, read_input, screen

    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"id": "x", "kind": "prefill_only", **line}) + "\n")
    lines = read_input(p)
    screen(lines, caps_checker(str(tiny_dir), tokenizer))
    assert lines[0].error.startswith("line 1: ") and msg in lines[0].error
