"""The shared request check: a corpus of bad requests, each refused with a message naming
the field; good requests come back as exactly the token ids the tokenizer gives."""
from __future__ import annotations

import numpy as np
import pytest

from engines.base import BeamRequest, Bounds, PrefillRequest, RequestRejected
from engines.validate import FieldNames, Limits, RequestChecker

VOCAB = 151936
EOS = 151645
BOUNDS = Bounds(max_samples_per_request=4, max_prompt_tokens=16, max_beam_width=8, max_decode_steps=3)


@pytest.fixture(scope="module")
def checker(tokenizer):
    return RequestChecker(Limits(BOUNDS, VOCAB, 64, frozenset({EOS})), tokenizer)


def _prefill(samples, labels=(" yes", " no")):
    return PrefillRequest("r", samples, list(labels) if isinstance(labels, tuple) else labels)


def _beam(prompt=[5, 6, 7], w=2, s=2, allowed=None):
    return BeamRequest("b", prompt, w, s, allowed)


CODES = ((11, 12), (11, 13), (14, 15))

BAD = [
    # samples
    (_prefill("hello"), "samples: expected a list"),
    (_prefill([]), "samples: need at least one"),
    (_prefill([""]), "samples.0: empty sample"),
    (_prefill([[]]), "samples.0: empty"),
    (_prefill([[1, 2.0]]), "samples.0.1: token ids are integers"),
    (_prefill([[1, True]]), "samples.0.1: token ids are integers"),
    (_prefill([[1, "2"]]), "samples.0.1: token ids are integers"),
    (_prefill([[-1, 2]]), "samples.0: token id -1 outside [0, 151936)"),
    (_prefill([[VOCAB]]), f"samples.0: token id {VOCAB} outside"),
    (_prefill([[1], 5]), "samples.1: expected a list of token ids"),
    (_prefill([[1]] * 5), "samples: 5 samples > max_samples_per_request 4"),
    (_prefill([list(range(1, 18))]), "samples.0: 17 tokens > max_prompt_tokens 16"),
    (_prefill([" word" * 17]), "samples.0: 17 tokens > max_prompt_tokens 16"),
    # labels
    (_prefill([[1]], " yes"), "labels: expected a list"),
    (_prefill([[1]], []), "labels: need at least two labels"),
    (_prefill([[1]], [" yes"]), "labels: need at least two labels"),
    (_prefill([[1]], [" yes", " two words"]), "labels.1: label ' two words' is 2 tokens"),
    (_prefill([[1]], [" yes", " yes"]), "labels.1: same token"),
    (_prefill([[1]], [5, 5]), "labels.1: same token"),
    (_prefill([[1]], [5, -1]), "labels.1: label id -1 outside"),
    (_prefill([[1]], [5, VOCAB + 9]), "labels.1: label id"),
    (_prefill([[1]], [5, 6.0]), "labels.1: a label is text or a token id"),
    (_prefill([[1]], [5, True]), "labels.1: a label is text or a token id"),
    (_prefill([[1]], [5, ""]), "labels.1: empty label"),
    (_prefill([[1]], [5, None]), "labels.1: a label is text or a token id"),
    # beams
    (_beam(w=0), "beam_width: 0 outside 1..8"),
    (_beam(w=9), "beam_width: 9 outside 1..8"),
    (_beam(w=10**6), "beam_width: 1000000 outside 1..8"),
    (_beam(w=4.9), "beam_width: expected an integer, got 4.9"),
    (_beam(w=True), "beam_width: expected an integer, got True"),
    (_beam(w="4"), "beam_width: expected an integer"),
    (_beam(s=0), "decode_steps: 0 outside 1..3"),
    (_beam(s=2.0), "decode_steps: expected an integer"),
    (_beam(prompt=""), "prompt: empty prompt"),
    (_beam(prompt=[]), "prompt: empty"),
    (_beam(prompt=None), "prompt: expected a list of token ids"),
    (_beam(prompt=[1.5]), "prompt.0: token ids are integers"),
    (_beam(prompt=list(range(1, 18))), "prompt: 17 tokens > max_prompt_tokens 16"),
    # item codes
    (_beam(allowed=()), "allowed: no item codes"),
    (_beam(allowed="ab"), "allowed: expected a list of item codes"),
    (_beam(allowed=((11,), (12,))), "allowed: every item code must be exactly decode_steps = 2 tokens"),
    (_beam(allowed=((11, 12), (13,))), "got lengths [1, 2]"),
    (_beam(allowed=((11, 12), (11, -3))), "allowed.1: token id -3 outside"),
    (_beam(allowed=((11, 12), (11, 2.0))), "allowed.1.1: token ids are integers"),
    (_beam(allowed=((11, 12), (11, EOS))), f"allowed.1: holds EOS id {EOS}"),
    (_beam(w=4, allowed=CODES), "allowed: beam_width 4 > 3 distinct item codes"),
    (_beam(w=3, allowed=CODES + CODES[:1]) , None),  # duplicates do not count twice, 3 <= 3
    (_beam(w=4, allowed=CODES + CODES), "beam_width 4 > 3 distinct"),
]


@pytest.mark.parametrize("request_, message", BAD, ids=[m or "ok" for _, m in BAD])
def test_bad_requests_are_refused_with_the_field(checker, request_, message):
    if message is None:
        checker.check(request_)
        return
    with pytest.raises(RequestRejected) as e:
        checker.check(request_)
    assert message in str(e.value)


def test_good_requests_are_the_tokenizers_ids(checker, tokenizer):
    got = checker.check(_prefill([" hello there", [5, 6, np.int64(7)]], [" yes", 1000]))
    assert got.seqs == [tokenizer.encode(" hello there", add_special_tokens=False), [5, 6, 7]]
    assert got.labels == [tokenizer.encode(" yes", add_special_tokens=False)[0], 1000]
    assert all(type(t) is int for s in got.seqs for t in s)
    beam = checker.check(_beam(prompt=" the code is", w=3, s=2, allowed=CODES))
    assert beam.prompt == tokenizer.encode(" the code is", add_special_tokens=False)
    assert (beam.beam_width, beam.decode_steps, beam.allowed) == (3, 2, CODES)


def test_positions_count_the_decode_steps(tokenizer):
    c = RequestChecker(Limits(Bounds(max_prompt_tokens=100, max_beam_width=2, max_decode_steps=3), VOCAB, 10),
                       tokenizer)
    c.check(_beam(prompt=list(range(1, 8)), s=3))
    with pytest.raises(RequestRejected, match=r"prompt: 8 tokens \+ 3 decode steps > the model's 10 positions"):
        c.check(_beam(prompt=list(range(1, 9)), s=3))


def test_truncate_keeps_the_end(tokenizer):
    c = RequestChecker(Limits(Bounds(max_samples_per_request=2, max_prompt_tokens=3, on_violation="truncate"),
                              VOCAB), tokenizer)
    got = c.check(_prefill([[1, 2, 3, 4, 5], [6], [7]]))
    assert got.seqs == [[3, 4, 5], [6]]


def test_field_names_follow_the_caller(tokenizer):
    names = FieldNames(samples="items", labels="label_token_ids", prompt="input_ids",
                       beam_width="sampling_params.beam_width", decode_steps="sampling_params.max_new_tokens")
    c = RequestChecker(Limits(BOUNDS, VOCAB), tokenizer, names)
    with pytest.raises(RequestRejected, match=r"^items\.1: empty"):
        c.check(_prefill([[1], []]))
    with pytest.raises(RequestRejected, match=r"^sampling_params\.max_new_tokens: 9 outside"):
        c.check(_beam(s=9))


def test_label_cache_does_not_mix_bools_and_ints(checker):
    checker.check(_prefill([[1]], [1, 2]))
    with pytest.raises(RequestRejected, match="labels.0"):
        checker.check(_prefill([[1]], [True, 2]))


def test_without_a_tokenizer_text_is_not_tokenized():
    c = RequestChecker(Limits(BOUNDS, VOCAB))
    got = c.check(_prefill([" any text at all, however long" * 50, [3]], [" a", " b"]))
    assert got.seqs == [[], [3]] and got.labels == [-1, -1]
    with pytest.raises(RequestRejected, match="labels.1: same token ' a'"):
        c.check(_prefill([[1]], [" a", " a"]))


# --- query + items --------------------------------------------------------------------

QBOUNDS = Bounds(max_samples_per_request=3, max_prompt_tokens=16, max_query_tokens=4, max_item_tokens=3)


@pytest.fixture(scope="module")
def qchecker(tokenizer):
    return RequestChecker(Limits(QBOUNDS, VOCAB, 64), tokenizer)


def _query(query, items, labels=(" yes", " no"), **kw):
    return PrefillRequest("q", kw.pop("samples", ()), list(labels), query=query, items=items)


def _enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


QUERY_BAD = [
    (_query([1, 2], []), "items: need at least one item"),
    (_query([1, 2], [[3]] * 4), "items: 4 items > max_samples_per_request 3"),
    (_query([1, 2], [3]), "items.0: expected a list of token ids"),
    (_query([1, 2], " a"), "items: expected a list of items"),
    (_query([1, 2], [[3], []]), "items.1: empty"),
    (_query([1, 2], [[3], [2.0]]), "items.1.0: token ids are integers"),
    (_query([1, 2], [[3], [VOCAB]]), f"items.1: token id {VOCAB} outside"),
    (_query([1, 2], [" text"]), "items.0: expected a list of token ids, got str (query and items: all text"),
    (_query(" text", [[3]]), "items.0: expected text like the query, got list"),
    (_query("", [" a"]), "query: empty"),
    (_query([], [[3]]), "query: empty"),
    (_query([True], [[3]]), "query.0: token ids are integers"),
    (_query(" q", [" a", ""]), "items.1: empty"),
    (_query([1, 2, 3, 4, 5], [[3]]), "query: 5 tokens > max_query_tokens 4"),
    (_query([1], [[3], [4, 5, 6, 7]]), "items.1: 4 tokens > max_item_tokens 3"),
    (_query([1], [[3]], samples=[[1]]), "give samples, or query + items, not both"),
    (_query([1], [[3]], labels=[" yes"]), "labels: need at least two"),
]


@pytest.mark.parametrize("request_, message", QUERY_BAD, ids=[m for _, m in QUERY_BAD])
def test_bad_query_requests_are_refused_with_the_field(qchecker, request_, message):
    with pytest.raises(RequestRejected) as e:
        qchecker.check(request_)
    assert message in str(e.value)


def test_query_ids_come_back_as_the_concatenations(qchecker):
    got = qchecker.check(_query([1, 2, np.int64(3)], [[4], [5, 6]]))
    assert got.seqs == [[1, 2, 3, 4], [1, 2, 3, 5, 6]] and got.query_len == 3
    assert got.query == [1, 2, 3] and got.items == [[4], [5, 6]]
    plain = qchecker.check(_prefill([[1, 2]]))
    assert plain.query_len == 0 and plain.items == [[1, 2]]


def test_query_text_is_tokenized_as_one_string_per_sample(qchecker, tokenizer):
    query, items = " is it", [" cats", " red", "?"]
    got = qchecker.check(_query(query, items))
    assert got.seqs == [_enc(tokenizer, query + i) for i in items]  # however the pieces were cut
    assert got.query == _enc(tokenizer, query)  # a word boundary: the query's own tokens are shared


def test_a_merge_across_the_boundary_shares_only_the_common_prefix(tokenizer):
    c = RequestChecker(Limits(Bounds(max_query_tokens=8, max_item_tokens=8), VOCAB), tokenizer)
    query, items = " hello wor", ["ld", "ds", " there"]
    assert _enc(tokenizer, query + items[0])[: len(_enc(tokenizer, query))] != _enc(tokenizer, query)
    got = c.check(_query(query, items))
    assert got.seqs == [_enc(tokenizer, query + i) for i in items]
    assert 0 < got.query_len < len(_enc(tokenizer, query)) and all(got.items)
    same = c.check(_query(" the query", [" same", " same"]))  # identical items keep a token each
    assert same.seqs == [_enc(tokenizer, " the query same")] * 2 and all(same.items)


def test_query_truncation_keeps_the_ends_and_the_first_items(tokenizer):
    b = Bounds(max_samples_per_request=2, max_query_tokens=2, max_item_tokens=2, on_violation="truncate")
    got = RequestChecker(Limits(b, VOCAB), tokenizer).check(_query([1, 2, 3], [[4, 5, 6], [7], [8]]))
    assert got.seqs == [[2, 3, 5, 6], [2, 3, 7]] and got.query_len == 2


def test_query_positions_count_the_query(tokenizer):
    c = RequestChecker(Limits(Bounds(max_query_tokens=8, max_item_tokens=8), VOCAB, 10), tokenizer)
    c.check(_query(list(range(1, 8)), [[1, 2, 3]]))
    with pytest.raises(RequestRejected, match=r"items.0: 4 tokens \+ 7 query tokens > the model's 10 positions"):
        c.check(_query(list(range(1, 8)), [[1, 2, 3, 4]]))


def test_query_without_a_tokenizer(tokenizer):
    c = RequestChecker(Limits(QBOUNDS, VOCAB))
    assert c.check(_query(" any text", [" a", " b"])).seqs == [[], []]
    assert c.check(_query([1], [[2], [3]])).seqs == [[1, 2], [1, 3]]


def test_text_too_long_for_the_bounds_is_refused_before_tokenizing(tokenizer, monkeypatch):
    c = RequestChecker(Limits(BOUNDS, VOCAB, 64), tokenizer)
    calls = []
    real = type(tokenizer).__call__
    monkeypatch.setattr(type(tokenizer), "__call__", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    long = "x" * (16 * 256 + 1)  # 16 tokens of at most 256 bytes each
    with pytest.raises(RequestRejected, match="samples.1: 4,097 characters are more than max_prompt_tokens 16"):
        c.check(_prefill([" fine", long]))
    with pytest.raises(RequestRejected, match="prompt: 4,097 characters"):
        c.check(_beam(prompt=long))
    assert not calls  # refused before any tokenizing
    trunc = RequestChecker(Limits(Bounds(max_prompt_tokens=16, on_violation="truncate"), VOCAB), tokenizer)
    assert len(trunc.check(_prefill([" word" * 5000])).seqs[0]) == 16  # truncation still sees the end


def test_each_concatenation_is_a_sample_within_max_prompt_tokens(tokenizer):
    b = Bounds(max_prompt_tokens=6, max_query_tokens=4, max_item_tokens=4)
    c = RequestChecker(Limits(b, VOCAB), tokenizer)
    assert c.check(_query([1, 2, 3], [[4, 5, 6]])).seqs == [[1, 2, 3, 4, 5, 6]]
    with pytest.raises(RequestRejected, match=r"items.1: 4 tokens \+ 3 query tokens > max_prompt_tokens 6"):
        c.check(_query([1, 2, 3], [[4], [5, 6, 7, 8]]))
    t = RequestChecker(Limits(Bounds(max_prompt_tokens=6, max_query_tokens=9, max_item_tokens=4,
                                     on_violation="truncate"), VOCAB), tokenizer)
    got = t.check(_query([1, 2, 3, 4, 5, 6, 7], [[8, 9, 10, 11]]))
    assert got.seqs == [[3, 4, 5, 6, 7, 11]] and got.query_len == 5  # the query leaves one token of room


def test_query_text_too_long_is_refused_before_tokenizing(tokenizer, monkeypatch):
    c = RequestChecker(Limits(QBOUNDS, VOCAB, 64), tokenizer)
    calls = []
    real = type(tokenizer).__call__
    monkeypatch.setattr(type(tokenizer), "__call__", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    with pytest.raises(RequestRejected, match="query: 1,025 characters are more than max_query_tokens 4"):
        c.check(_query("x" * 1025, [" a"]))
    with pytest.raises(RequestRejected, match="items.1: 769 characters are more than max_item_tokens 3"):
        c.check(_query(" q", [" a", "x" * 769]))
    assert not calls
    small = RequestChecker(Limits(Bounds(max_prompt_tokens=4, max_query_tokens=8), VOCAB), tokenizer)
    with pytest.raises(RequestRejected, match=r"query: 5 tokens > max_prompt_tokens - 1 \(room for an item\) 3"):
        small.check(_query([1, 2, 3, 4, 5], [[6]]))
