import math

import pytest

from engines.base import BeamRequest, PrefillRequest
from harness.measure.flops import ModelShape, beam_flops, prefill_flops
from harness.measure.records import LoadPoint, RequestRecord
from harness.measure.metrics import P99_MIN_REQUESTS, latency_summary, summarise
from harness.workload.requests import WorkItem

SHAPE = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=100)


def test_latency_summary_by_hand():
    s = latency_summary([10, 20, 30, 40, 100])
    assert s["mean_ms"] == 40
    assert s["p50_ms"] == 30
    assert s["p90_ms"] == pytest.approx(76.0)  # 40 + 0.6 * (100 - 40)
    assert s["p99_ms"] == pytest.approx(97.6)  # 40 + 0.96 * 60
    assert s["max_ms"] == 100


def _rec(i, sched, sent, done, status="ok", tokens=(3, 5), warmup=False):
    item = WorkItem(PrefillRequest(str(i), ["a"] * len(tokens), [" a", " b"]), tokens)
    return RequestRecord(i, item, warmup, sched, sent, done, status)


def test_point_metrics_by_hand():
    recs = [_rec(0, 0.0, 0.0, 5.0, warmup=True),  # excluded
            _rec(1, 1.0, 1.0, 1.5), _rec(2, 1.2, 1.3, 2.0), _rec(3, 1.5, 1.5, 3.0, status="error")]
    m = summarise(LoadPoint("poisson", 2.0, recs), SHAPE, peak_tflops=1.0)
    assert m.requests == 3 and m.ok == 2 and m.errors == 1
    assert m.window_s == pytest.approx(2.0)  # first scheduled 1.0 .. last done 3.0
    assert m.mean_ms == pytest.approx((500 + 800) / 2)
    assert m.qps == pytest.approx(1.0)
    assert m.samples_per_s == pytest.approx(2.0)
    assert m.tokens_per_s == pytest.approx(8.0)
    flops = 2 * (prefill_flops(SHAPE, 3) + prefill_flops(SHAPE, 5))
    assert m.effective_tflops == pytest.approx(flops / 2.0 / 1e12)
    assert m.mfu == pytest.approx(flops / 2.0 / 1e12)
    assert m.send_lag_p99_ms == pytest.approx(100 * 0.98, rel=1e-6)  # lags 0, 100, 0 ms
    assert m.p99_estimate and m.fell_behind  # 98 ms lag > 1 ms


def test_fell_behind_from_achieved_rate():
    recs = [_rec(i, i * 0.1, i * 0.1 * 1.2, i * 0.1 * 1.2 + 0.001) for i in range(10)]
    m = summarise(LoadPoint("poisson", 10, recs), SHAPE, 1.0)
    assert m.achieved_rate_ratio == pytest.approx(1 / 1.2)
    assert m.fell_behind
    on_time = [_rec(i, i * 0.1, i * 0.1 + 1e-5, i * 0.1 + 0.001) for i in range(500)]
    m = summarise(LoadPoint("poisson", 10, on_time), SHAPE, 1.0)
    assert not m.fell_behind and not m.p99_estimate and len(on_time) >= P99_MIN_REQUESTS


def test_beam_request_tokens_and_flops():
    item = WorkItem(BeamRequest("b", "x", 4, 3), (10,))
    m = summarise(LoadPoint("closed", 1, [RequestRecord(0, item, False, 0.0, 0.0, 2.0, "ok")]), SHAPE, 1.0)
    assert m.tokens_per_s == pytest.approx((10 + 12) / 2)
    assert m.effective_tflops == pytest.approx(beam_flops(SHAPE, 10, 4, 3) / 2 / 1e12)


def test_empty_point_is_nan_not_crash():
    m = summarise(LoadPoint("closed", 1, []), SHAPE, 1.0)
    assert m.requests == 0 and math.isnan(m.mean_ms) and math.isnan(m.qps)


def _beam_rec(i, done, beams, codes, warmup=False, status="ok", width=4, steps=2):
    from engines.base import Beam, BeamResult

    item = WorkItem(BeamRequest(str(i), "p", width, steps), (6,), codes=frozenset(codes))
    result = BeamResult(str(i), [Beam(list(b), "", 0.0) for b in beams]) if status == "ok" else None
    return RequestRecord(i, item, warmup, 0.0, 0.0, done, status, result=result)


def test_beam_throughput_and_valid_code_rate_by_hand():
    codes = {(1, 2), (3, 4), (5, 6)}
    recs = [
        _beam_rec(0, 9.0, [(9, 9)] * 4, codes, warmup=True),  # excluded
        _beam_rec(1, 0.5, [(1, 2), (3, 4), (7, 7), (5, 6)], codes),  # 3 of 4 are codes
        _beam_rec(2, 1.0, [(1, 2), (2, 1)], codes),  # 1 of 2 (an engine may return fewer than W)
        _beam_rec(3, 2.0, [(8, 8), (9, 9), (3, 4), (4, 3)], codes),  # 1 of 4
        _beam_rec(4, 1.5, [], codes, status="error"),
    ]
    m = summarise(LoadPoint("closed", 1, recs), SHAPE, peak_tflops=1.0)
    assert m.window_s == pytest.approx(2.0) and m.ok == 3
    assert m.beams_per_s == pytest.approx(3 * 4 / 2.0)  # W x answered requests / window
    assert m.generated_tokens_per_s == pytest.approx(3 * 4 * 2 / 2.0)  # W x S x requests / window
    assert m.tokens_per_s == pytest.approx((3 * 6 + 3 * 8) / 2.0)
    assert m.valid_code_rate == pytest.approx((3 + 1 + 1) / (4 + 2 + 4))
    assert math.isnan(m.items_per_s)


def test_items_per_s_and_no_codes_for_scoring():
    recs = [_rec(1, 0.0, 0.0, 1.0, tokens=(3, 5, 7)), _rec(2, 0.0, 0.0, 4.0, tokens=(2,))]
    m = summarise(LoadPoint("closed", 2, recs), SHAPE, peak_tflops=1.0)
    assert m.items_per_s == pytest.approx(4 / 4.0)
    assert math.isnan(m.beams_per_s) and math.isnan(m.generated_tokens_per_s) and math.isnan(m.valid_code_rate)


def test_beams_without_codes_have_no_valid_code_rate():
    rec = _beam_rec(1, 1.0, [(1, 2)] * 4, ())
    rec = RequestRecord(1, WorkItem(rec.item.request, (6,)), False, 0.0, 0.0, 1.0, "ok", result=rec.result)
    m = summarise(LoadPoint("closed", 1, [rec]), SHAPE, peak_tflops=1.0)
    assert math.isnan(m.valid_code_rate) and m.beams_per_s == pytest.approx(4.0)
