"""The vLLM bodies and the mapping of its answers, against hand-computed values."""
import math

import pytest

from engines.base import EngineError
from engines.vllm import protocol


def choice(index, top):
    return {"index": index, "text": "", "logprobs": {"top_logprobs": [top]}}


def test_score_body_asks_for_the_labels_log_probs_in_one_call():
    assert protocol.score_body([[1, 2], [3]], [9454, 2152]) == {
        "prompt": [[1, 2], [3]], "max_tokens": 1, "temperature": 0, "logprobs": 2,
        "logprob_token_ids": [9454, 2152], "return_tokens_as_token_ids": True}


def test_scores_are_the_softmax_over_the_labels_in_choice_order():
    payload = {"choices": [
        choice(1, {"token_id:5": -0.1, "token_id:7": math.log(0.3), "token_id:8": math.log(0.1)}),
        choice(0, {"token_id:7": math.log(0.02), "token_id:8": math.log(0.06)}),
    ]}
    rows = protocol.parse_scores(payload, 2, [7, 8])
    assert rows[0] == pytest.approx([0.25, 0.75])  # index 0 first, whatever the order sent
    assert rows[1] == pytest.approx([0.75, 0.25])  # the sampled token (5) is not a label


def test_a_missing_label_or_choice_is_an_engine_error():
    with pytest.raises(EngineError, match="label 'token_id:8' of sample 0"):
        protocol.parse_scores({"choices": [choice(0, {"token_id:7": -1.0})]}, 1, [7, 8])
    with pytest.raises(EngineError, match="1 choices for 2 samples"):
        protocol.parse_scores({"choices": [choice(0, {"token_id:7": -1.0})]}, 2, [7])
    with pytest.raises(EngineError, match="NoneType choices"):
        protocol.parse_scores({"error": "x"}, 1, [7])


def test_beam_body_is_vllm_beam_search_with_eos_ignored_and_no_length_penalty():
    assert protocol.beam_body([4, 5, 6], 8, 3) == {
        "prompt": [4, 5, 6], "use_beam_search": True, "n": 8, "max_tokens": 3, "temperature": 0,
        "ignore_eos": True, "length_penalty": 0.0, "logprobs": 0, "return_token_ids": True,
        "return_tokens_as_token_ids": True}


def test_beams_carry_the_sum_of_their_token_log_probs_best_first():
    def beam(index, ids, lps):
        return {"index": index, "text": f"b{index}", "token_ids": ids, "logprobs": {"token_logprobs": lps}}

    payload = {"choices": [beam(1, [3, 4], [-1.0, -2.5]), beam(0, [1, 2], [-0.5, -0.25])]}
    beams = protocol.parse_beams(payload, 2)
    assert [b.token_ids for b in beams] == [[1, 2], [3, 4]]
    assert [b.logprob for b in beams] == [-0.75, -3.5]
    assert beams[0].text == "b0"
    with pytest.raises(EngineError, match="log-probs"):
        protocol.parse_beams({"choices": [beam(0, [1, 2], [-0.5])]}, 1)
