"""Agreement between engines' answers, against hand-computed values."""
import math

from engines.base import Beam, BeamRequest, BeamResult
from harness.measure.agreement import agreement, beam_overlap, beam_recall, constrained_beams
from harness.measure.records import LoadPoint, RequestRecord
from harness.workload.requests import WorkItem


def _beams(*seqs, lp=None):
    return [{"token_ids": list(s), "logprob": (lp or {}).get(s, -float(i))} for i, s in enumerate(seqs)]


def test_prefill_label_probability_differences():
    a = {"r0": {"id": "r0", "scores": [[0.9, 0.1], [0.4, 0.6]]}, "r1": {"id": "r1", "scores": [[0.5, 0.5]]}}
    b = {"r0": {"id": "r0", "scores": [[0.8, 0.2], [0.7, 0.3]]}, "r1": {"id": "r1", "scores": [[0.5, 0.5]]},
         "only_b": {"id": "only_b", "scores": [[1.0, 0.0]]}}
    got = agreement(a, b)
    assert got["kind"] == "prefill_only" and got["requests"] == 2 and got["samples"] == 3
    assert math.isclose(got["max_abs_diff"], 0.3)
    assert math.isclose(got["mean_abs_diff"], (0.1 + 0.1 + 0.3 + 0.3 + 0 + 0) / 6)
    # top label: r0 s0 same (0), r0 s1 differs (1 vs 0), r1 tie -> argmax 0 both
    assert math.isclose(got["top_label_match"], 2 / 3)


def test_beam_top_w_overlap_and_logprob_difference():
    a = {"r": {"id": "r", "beams": _beams((1, 2), (1, 3), (4, 5), (6, 7), lp={(1, 2): -1.0, (1, 3): -2.0, (4, 5): -3.0})}}
    b = {"r": {"id": "r", "beams": _beams((1, 2), (4, 5), (1, 3), (9, 9), lp={(1, 2): -1.25, (1, 3): -2.0, (4, 5): -3.0})}}
    assert beam_overlap(a["r"]["beams"], b["r"]["beams"]) == 3 / 4
    got = agreement(a, b)
    assert got["kind"] == "beam_search" and got["requests"] == 1
    assert got["mean_overlap"] == got["min_overlap"] == 0.75
    assert got["top1_match"] == 1.0
    assert math.isclose(got["max_logprob_diff"], 0.25)


def test_errors_and_disjoint_ids_are_left_out():
    a = {"r": {"id": "r", "error": "boom"}}
    b = {"r": {"id": "r", "scores": [[1.0, 0.0]]}}
    assert agreement(a, b) is None
    assert agreement({"x": {"id": "x", "scores": [[1.0]]}}, {"y": {"id": "y", "scores": [[1.0]]}}) is None


def _point(answers, codes=frozenset({(1, 1)}), status="ok", warmup=False):
    recs = []
    for i, beams in enumerate(answers):
        item = WorkItem(BeamRequest(f"r{i}", "p", 4, 2), (3,), codes=codes)
        recs.append(RequestRecord(i, item, warmup, 0.0, 0.0, 1.0, status,
                                  result=BeamResult(f"r{i}", [Beam(list(b), "", 0.0) for b in beams])))
    return LoadPoint("closed", 1, recs)


def test_constrained_beams_keep_only_measured_answered_requests_sent_with_codes():
    answers = [[(1, 1), (2, 2)], [(3, 3)]]
    assert constrained_beams([_point(answers)]) == {"r0": {(1, 1), (2, 2)}, "r1": {(3, 3)}}
    assert constrained_beams([_point(answers, codes=None)]) == {}
    assert constrained_beams([_point(answers, warmup=True)]) == {}
    assert constrained_beams([_point(answers, status="error")]) == {}
    later = _point([[(9, 9)]])  # the same request id answered again: the later answer counts
    assert constrained_beams([_point(answers), later]) == {"r0": {(9, 9)}, "r1": {(3, 3)}}


def test_beam_recall_is_the_mean_share_of_the_reference_beams_returned():
    ref = {"r0": {(1, 1), (2, 2), (3, 3), (4, 4)}, "r1": {(5, 5), (6, 6)}, "r2": {(7, 7)}}
    got = {"r0": {(1, 1), (9, 9), (3, 3), (8, 8)}, "r1": {(6, 6), (5, 5), (7, 7)}, "only_here": {(1, 1)}}
    assert math.isclose(beam_recall(got, ref), (2 / 4 + 2 / 2) / 2)  # r2 not answered, only_here not in ref
    assert beam_recall({"r2": {(0, 0)}}, ref) == 0.0
    assert math.isnan(beam_recall({}, ref)) and math.isnan(beam_recall(got, {}))
