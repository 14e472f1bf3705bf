"""HTTP bodies and answer mapping, against answers captured from a real SGLang 0.5.23 server."""
import pytest

from engines.base import EngineError
from engines.sglang import protocol

# POST /generate {"input_ids": [1,2,3,4,5], "sampling_params": {"beam_width": 3, "n": 3,
# "max_new_tokens": 3, "temperature": 0}} on the tiny preset (float32), meta_info trimmed;
# the third beam is made to end early on EOS (151645), as SGLang reports it.
BEAM_ANSWER = {
    "text": "抽烟 />}\n harmonic", "output_ids": [115980, 36781, 81241],
    "meta_info": {"id": "0709a5", "finish_reason": {"type": "length", "length": 3}, "prompt_tokens": 5,
                  "sequence_score": -0.9926274617513021,
                  "beam_results": [
                      {"output_ids": [115980, 36781, 81241], "text": "抽烟 />}\n harmonic",
                       "meta_info": {"finish_reason": {"type": "length", "length": 3},
                                     "sequence_score": -0.9926274617513021}},
                      {"output_ids": [115980, 36781, 107817], "text": "抽烟 />}\n但却",
                       "meta_info": {"finish_reason": {"type": "length", "length": 3},
                                     "sequence_score": -1.4882965087890625}},
                      {"output_ids": [115980, 151645], "text": "抽烟",
                       "meta_info": {"finish_reason": {"type": "stop", "matched": 151645},
                                     "sequence_score": -2.5}}]}}

GREEDY_ANSWER = {"text": "抽烟 />}\n harmonic", "output_ids": [115980, 36781, 81241],
                 "meta_info": {"output_token_logprobs": [[-1.4251974821090698, 115980, None],
                                                         [-0.5807242393493652, 36781, None],
                                                         [-0.9719164967536926, 81241, None]]}}


def test_score_body_scores_each_sample_alone():
    body = protocol.score_body([], [[1, 2, 3], (4, 5)], (9454, 2152))
    assert body == {"query": [], "items": [[1, 2, 3], [4, 5]], "label_token_ids": [9454, 2152],
                    "apply_softmax": True}


def test_score_body_sends_a_query_as_it_is():
    body = protocol.score_body((7, 8), [[1], [2, 3]], [5, 6])
    assert body["query"] == [7, 8] and body["items"] == [[1], [2, 3]]


def test_parse_scores_checks_shape():
    assert protocol.parse_scores({"scores": [[0.25, 0.75], [1, 0]]}, 2, 2) == [[0.25, 0.75], [1.0, 0.0]]
    with pytest.raises(EngineError, match="1 score rows for 2 samples"):
        protocol.parse_scores({"scores": [[0.5, 0.5]]}, 2, 2)
    with pytest.raises(EngineError, match="for 3 labels"):
        protocol.parse_scores({"scores": [[0.5, 0.5]]}, 1, 3)


def test_beam_body_and_greedy_body():
    assert protocol.generate_body((7, 8), 4, 3) == {
        "input_ids": [7, 8],
        "sampling_params": {"beam_width": 4, "n": 4, "max_new_tokens": 3, "temperature": 0}}
    greedy = protocol.generate_body([7, 8], 1, 3)
    assert "beam_width" not in greedy["sampling_params"]
    assert greedy["sampling_params"]["min_new_tokens"] == 3 and greedy["return_logprob"] is True


def test_beams_keep_server_order_and_recover_cumulative_logprob():
    beams = protocol.parse_beams(BEAM_ANSWER, 3)
    assert [b.token_ids for b in beams] == [[115980, 36781, 81241], [115980, 36781, 107817], [115980, 151645]]
    # sequence_score is cumulative / length: a 3-token beam at -0.99262746 has cumulative -2.9778824
    assert beams[0].logprob == pytest.approx(-2.9778824, abs=1e-6)
    assert beams[2].logprob == pytest.approx(-5.0)  # the EOS-ended beam is kept, 2 tokens long
    assert beams[1].text == "抽烟 />}\n但却"


def test_greedy_logprob_is_the_sum_of_token_logprobs():
    (beam,) = protocol.parse_beams(GREEDY_ANSWER, 1)
    assert beam.token_ids == [115980, 36781, 81241]
    assert beam.logprob == pytest.approx(-2.9778382, abs=1e-6)


def test_missing_beam_results_is_an_error():
    with pytest.raises(EngineError, match="beam_results"):
        protocol.parse_beams({"meta_info": {}}, 4)
    with pytest.raises(EngineError, match="meta_info"):
        protocol.parse_beams({"detail": "x"}, 4)

