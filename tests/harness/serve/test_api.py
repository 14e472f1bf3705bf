"""`/v1/score` bodies -> engine requests (harness.serve.api.Translator), without a server."""
import pytest

from engines.base import Bounds
from harness.serve.api import ApiError, ScoreBody, Translator


@pytest.fixture
def translator(tokenizer):
    return Translator(tokenizer, 151936, Bounds(max_samples_per_request=3, max_prompt_tokens=16,
                                                 max_query_tokens=4, max_item_tokens=3))


def _body(**kw):
    return ScoreBody(**{"label_token_ids": [1, 2], "apply_softmax": True, **kw})


def test_a_query_becomes_a_query_request(translator, tokenizer):
    t = translator.score(_body(query=[5, 6, 7], items=[[8], [9, 10]]), "r")
    req = t.request
    assert req.has_query and (req.query, req.items, req.samples) == ([5, 6, 7], [[8], [9, 10]], ())
    assert t.prompt_tokens == 4 + 5  # usage counts each concatenation
    t = translator.score(_body(query=" is it", items=[" a cat", " red"]), "r")
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert [t.request.query + i for i in t.request.items] == [enc(" is it a cat"), enc(" is it red")]


def test_no_query_or_item_first_sends_plain_samples(translator):
    req = translator.score(_body(query=[], items=[[8], [9, 10]]), "r").request
    assert not req.has_query and req.samples == [[8], [9, 10]]
    req = translator.score(_body(query=[5], items=[[8]], item_first=True), "r").request
    assert not req.has_query and req.samples == [[8, 5]]


@pytest.mark.parametrize("body, msg", [
    (dict(query=[1, 2, 3, 4, 5], items=[[8]]), "query: 5 tokens > max_query_tokens 4"),
    (dict(query=[1], items=[[8], [8, 9, 10, 11]]), r"items\.1: 4 tokens > max_item_tokens 3"),
    (dict(query=[1], items=[[8]] * 4), "items: 4 items > max_samples_per_request 3"),
    (dict(query=[1], items=[[8], []]), r"items\.1: empty"),
    (dict(query=[1], items=[[151936]]), r"items\.0: token id 151936 outside"),
    (dict(query=[-1], items=[[5]]), "query: token id -1 outside"),
    (dict(query=" q", items=[" a", ""]), r"items\.1: empty"),
])
def test_query_bodies_are_checked_against_the_bounds(translator, body, msg):
    with pytest.raises(ApiError, match=msg) as e:
        translator.score(_body(**body), "r")
    assert e.value.status == 400


@pytest.mark.parametrize("raw, msg", [  # found by a hostile pass after the server tests were written
    (b'{"items": [" a"], "items": [" b"], "label_token_ids": [1, 2], "apply_softmax": true}',
     "body is not valid JSON: field 'items' appears twice"),
    (b'{"items": [" a"], "label_token_ids": [1, NaN], "apply_softmax": true}', "NaN is not a JSON number"),
    (b'{"items": [" caf\xe9"], "label_token_ids": [1, 2], "apply_softmax": true}', "body is not UTF-8 text"),
    (b'{"items": [[1.0]], "label_token_ids": [1, 2], "apply_softmax": true}',
     "invalid request: field items.0.0: Input should be a valid integer"),
])
def test_bodies_are_parsed_strictly(raw, msg):
    from harness.serve.api import parse_body

    with pytest.raises(ApiError, match=msg) as e:
        parse_body(ScoreBody, raw)
    assert e.value.status == 400


def test_body_errors_carry_no_yaml_hints():
    """A JSON body's `true` is a boolean as written: the scenario files' YAML hint misled here."""
    from harness.serve.api import parse_body

    with pytest.raises(ApiError) as e:
        parse_body(ScoreBody, b'{"items": [" a"], "label_token_ids": [true, 2], "apply_softmax": true}')
    assert str(e.value).endswith("field label_token_ids.0: Input should be a valid integer"), str(e.value)


def test_a_text_item_too_long_names_the_cap_it_broke(translator):
    with pytest.raises(ApiError) as e:  # it once said "max_item_tokens 256" (the query + item cap, misnamed)
        translator.score(_body(query=" q", items=[" a" * 5000]), "r")
    assert "items.0: 10,000 characters are more than max_item_tokens 3 tokens" in str(e.value)


def test_text_that_is_not_unicode_is_a_400(translator):
    from harness.serve.api import parse_body

    body = parse_body(ScoreBody, b'{"items": ["\\ud800 x"], "label_token_ids": [1, 2], "apply_softmax": true}')
    with pytest.raises(ApiError, match="items.0: not valid Unicode text"):
        translator.score(body, "r")
