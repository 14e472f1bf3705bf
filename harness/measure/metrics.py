"""Metrics from request records, computed by the same code for every engine."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from engines.base import BeamRequest, BeamResult
from harness.measure.flops import ModelShape, request_flops
from harness.measure.records import LoadPoint, RequestRecord

# Fewest requests for which a P99 is a measurement rather than an estimate: MLPerf's
# early-stopping rule at 99% confidence with no request over the bound.
P99_MIN_REQUESTS = 459
LAG_P99_LIMIT_MS = 1.0
ACHIEVED_RATE_MIN = 0.95
# a Poisson point's mean latency this many times that of a point at a higher rate: queueing
# cannot do that (at a lower rate a request waits less), so the machine or the engine slows
# while idle between requests. Seen on this project's VMs: memory left untouched for a
# fraction of a second is slow to touch again (`bench doctor`'s "idle memory" line), and a
# tiny-model request after 0.5 s idle took ~50 ms instead of ~3.
IDLE_RISE = 1.5


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default); NaN when empty."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float]:
    a = np.asarray(latencies_ms, dtype=float)
    if a.size == 0:
        return {k: float("nan") for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms")}
    return {"mean_ms": float(a.mean()), "p50_ms": percentile(a, 50), "p90_ms": percentile(a, 90),
            "p99_ms": percentile(a, 99), "max_ms": float(a.max())}


def record_tokens(rec: RequestRecord) -> int:
    """Valid input tokens plus generated tokens (W x S for beam search)."""
    return sum(rec.item.prompt_tokens) + record_generated(rec)


def record_beams(rec: RequestRecord) -> int:
    """Beams a beam-search request asks for (W); 0 for scoring."""
    req = rec.item.request
    return req.beam_width if isinstance(req, BeamRequest) else 0


def record_generated(rec: RequestRecord) -> int:
    """Tokens a beam-search request generates: W x S."""
    req = rec.item.request
    return req.beam_width * req.decode_steps if isinstance(req, BeamRequest) else 0


def record_items(rec: RequestRecord) -> int:
    """Items a scoring request scores (its samples); 0 for beam search."""
    return 0 if isinstance(rec.item.request, BeamRequest) else rec.item.samples


def valid_codes(records: Sequence[RequestRecord]) -> tuple[int, int]:
    """(beams that are item codes, beams returned) over answered beam requests that came
    with item codes (sent to the engine or held back from it)."""
    valid = returned = 0
    for r in records:
        if r.item.codes is not None and isinstance(r.result, BeamResult):
            returned += len(r.result.beams)
            valid += sum(tuple(b.token_ids) in r.item.codes for b in r.result.beams)
    return valid, returned


def record_flops(shape: ModelShape, rec: RequestRecord) -> int:
    req = rec.item.request
    if isinstance(req, BeamRequest):
        return request_flops(shape, rec.item.prompt_tokens, req.beam_width, req.decode_steps)
    return request_flops(shape, rec.item.prompt_tokens)


@dataclass
class PointMetrics:
    load_mode: str
    load_value: float
    requests: int  # measured (non-warm-up) requests that finished, any status
    ok: int
    errors: int
    timeouts: int
    rejected: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    p99_estimate: bool
    window_s: float
    qps: float
    samples_per_s: float
    tokens_per_s: float
    beams_per_s: float  # beam search: W x requests/s
    generated_tokens_per_s: float  # beam search: W x S x requests/s
    items_per_s: float  # scoring: samples (items) scored per second
    valid_code_rate: float  # share of returned beams that are item codes (NaN: no codes)
    effective_tflops: float
    mfu: float
    peak_tflops: float
    send_lag_p99_ms: float
    achieved_rate_ratio: float
    fell_behind: bool
    interrupted: str

    def row(self) -> dict:
        return asdict(self)


def summarise(point: LoadPoint, shape: ModelShape, peak_tflops: float) -> PointMetrics:
    measured = [r for r in point.records if not r.warmup and r.status != "cancelled"]
    ok = [r for r in measured if r.status == "ok"]
    if measured:
        window = max(r.done for r in measured) - min(r.scheduled for r in measured)
    else:
        window = float("nan")
    per_s = (lambda x: x / window) if window and window > 0 else (lambda x: float("nan"))
    flops = sum(record_flops(shape, r) for r in ok)
    lag_p99 = percentile([r.send_lag_ms for r in measured], 99)
    ratio = achieved_rate_ratio(measured) if point.mode == "poisson" else float("nan")
    fell_behind = point.mode == "poisson" and (lag_p99 > LAG_P99_LIMIT_MS or ratio < ACHIEVED_RATE_MIN)
    eff_tflops = per_s(flops) / 1e12
    beam = any(isinstance(r.item.request, BeamRequest) for r in measured)
    valid, returned = valid_codes(ok)
    return PointMetrics(
        load_mode=point.mode, load_value=point.value, requests=len(measured), ok=len(ok),
        errors=sum(r.status == "error" for r in measured),
        timeouts=sum(r.status == "timeout" for r in measured),
        rejected=sum(r.status == "rejected" for r in measured),
        **latency_summary([r.latency_ms for r in ok]),
        p99_estimate=len(ok) < P99_MIN_REQUESTS,
        window_s=window, qps=per_s(len(ok)), samples_per_s=per_s(sum(r.item.samples for r in ok)),
        tokens_per_s=per_s(sum(record_tokens(r) for r in ok)),
        beams_per_s=per_s(sum(map(record_beams, ok))) if beam else float("nan"),
        generated_tokens_per_s=per_s(sum(map(record_generated, ok))) if beam else float("nan"),
        items_per_s=float("nan") if beam or not measured else per_s(sum(map(record_items, ok))),
        valid_code_rate=valid / returned if returned else float("nan"),
        effective_tflops=eff_tflops, mfu=eff_tflops / peak_tflops if peak_tflops else float("nan"),
        peak_tflops=peak_tflops, send_lag_p99_ms=lag_p99, achieved_rate_ratio=ratio,
        fell_behind=bool(fell_behind), interrupted=point.interrupted,
    )


def achieved_rate_ratio(measured: list[RequestRecord]) -> float:
    """Achieved send rate over the scheduled rate of the same arrivals (1.0 = on time)."""
    if len(measured) < 2:
        return float("nan")
    first = min(r.scheduled for r in measured)
    planned = max(r.scheduled for r in measured) - first
    actual = max(r.sent for r in measured) - first
    return planned / actual if actual > 0 else float("nan")


def warnings_for(engine: str, m: PointMetrics) -> list[str]:
    at = f"{engine} @ {m.load_mode} {m.load_value:g}"
    out = []
    if m.fell_behind:
        out.append(f"{at}: the client fell behind its schedule (send-lag P99 {m.send_lag_p99_ms:.2f} ms, "
                   f"achieved {m.achieved_rate_ratio:.0%} of the scheduled rate); latencies still count from the schedule")
    bad = m.errors + m.timeouts + m.rejected
    if bad:
        out.append(f"{at}: {bad} of {m.requests} requests failed ({m.errors} errors, {m.timeouts} timeouts, {m.rejected} rejected)")
    if m.interrupted:
        out.append(f"{at}: {m.interrupted}; numbers cover what finished")
    return out


def latency_rose_as_rate_fell(points: Sequence[PointMetrics]) -> tuple[PointMetrics, PointMetrics] | None:
    """(a Poisson point, a point at a higher rate) where the first's mean latency is over
    IDLE_RISE times the second's, the lowest such rate first and the fastest higher one; None
    where latency did not rise as the rate fell (closed points and points that answered
    nothing are left out)."""
    answered = sorted((m for m in points if m.load_mode == "poisson" and m.ok and np.isfinite(m.mean_ms)),
                      key=lambda m: m.load_value)
    for low in answered:
        fastest = min((m for m in answered if m.load_value > low.load_value), key=lambda m: m.mean_ms, default=None)
        if fastest is not None and low.mean_ms > IDLE_RISE * fastest.mean_ms:
            return low, fastest
    return None


def idle_warnings(who: str, points: Sequence[PointMetrics]) -> list[str]:
    """The warning for `latency_rose_as_rate_fell` over one engine's Poisson points, if any."""
    rise = latency_rose_as_rate_fell(points)
    if rise is None:
        return []
    low, high = rise
    return [f"{who}: mean latency rose as the rate fell ({low.mean_ms:.1f} ms at {low.load_value:.3g} req/s, "
            f"{high.mean_ms:.1f} ms at {high.load_value:.3g} req/s); queueing cannot do that, so the machine or "
            "the engine slows while idle between requests (`bench doctor`'s idle memory line measures the "
            "machine): the lower rates measure that, not the load"]
