"""Agreement between two engines' answers to the same requests (DESIGN.md 6.4): label-
probability differences for scoring, top-W overlap for beams. Answers are `bench infer`
output lines ({"id", "scores"} or {"id", "beams"}), keyed by request id, so two runs' or two
`bench infer` files' answers compare the same way.

Beam recall, within a run: the share of the constrained reference's beams an engine returned,
from the load points' request records (`constrained_beams`, `beam_recall`)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from harness.measure.records import LoadPoint

Answer = Mapping[str, Any]
BeamSets = dict[str, set[tuple[int, ...]]]  # request id -> its beams' token ids
RECALL_REFERENCE = "hf"  # the constrained reference of beam recall when it ran (DESIGN: the correctness reference)


def prefill_agreement(a: Mapping[str, Answer], b: Mapping[str, Answer]) -> dict[str, Any]:
    """Over the samples of requests both answered: max and mean |p_a - p_b| over labels, and
    the share of samples whose most likely label is the same."""
    diffs, same_top, skipped = [], [], 0
    for rid in sorted(a.keys() & b.keys()):
        sa, sb = np.asarray(a[rid]["scores"], float), np.asarray(b[rid]["scores"], float)
        if sa.shape != sb.shape:
            skipped += 1
            continue
        diffs.append(np.abs(sa - sb).ravel())
        same_top.append(sa.argmax(-1) == sb.argmax(-1))
    d = np.concatenate(diffs) if diffs else np.empty(0)
    top = np.concatenate(same_top) if same_top else np.empty(0)
    return {"kind": "prefill_only", "requests": len(diffs), "samples": int(top.size), "mismatched_shape": skipped,
            "max_abs_diff": float(d.max()) if d.size else float("nan"),
            "mean_abs_diff": float(d.mean()) if d.size else float("nan"),
            "top_label_match": float(top.mean()) if top.size else float("nan")}


def beam_overlap(beams_a: list[Answer], beams_b: list[Answer]) -> float:
    """Share of the W returned sequences (token ids) that both engines returned."""
    sa = {tuple(x["token_ids"]) for x in beams_a}
    sb = {tuple(x["token_ids"]) for x in beams_b}
    width = max(len(beams_a), len(beams_b))
    return len(sa & sb) / width if width else float("nan")


def beam_agreement(a: Mapping[str, Answer], b: Mapping[str, Answer]) -> dict[str, Any]:
    """Over requests both answered: mean and min top-W overlap, share with the same best
    sequence, and the largest |log-prob| difference on sequences both returned."""
    overlaps, top1, lp_diff = [], [], 0.0
    for rid in sorted(a.keys() & b.keys()):
        ba, bb = a[rid]["beams"], b[rid]["beams"]
        overlaps.append(beam_overlap(ba, bb))
        top1.append(bool(ba and bb and ba[0]["token_ids"] == bb[0]["token_ids"]))
        lb = {tuple(x["token_ids"]): x["logprob"] for x in bb}
        for x in ba:
            if tuple(x["token_ids"]) in lb:
                lp_diff = max(lp_diff, abs(x["logprob"] - lb[tuple(x["token_ids"])]))
    return {"kind": "beam_search", "requests": len(overlaps),
            "mean_overlap": float(np.mean(overlaps)) if overlaps else float("nan"),
            "min_overlap": float(np.min(overlaps)) if overlaps else float("nan"),
            "top1_match": float(np.mean(top1)) if top1 else float("nan"),
            "max_logprob_diff": lp_diff if overlaps else float("nan")}


def agreement(a: Mapping[str, Answer], b: Mapping[str, Answer]) -> dict[str, Any] | None:
    """Compare two engines' answers; None when they share no answered request."""
    ok_a = {k: v for k, v in a.items() if "error" not in v}
    ok_b = {k: v for k, v in b.items() if "error" not in v}
    common = ok_a.keys() & ok_b.keys()
    if not common:
        return None
    first = ok_a[next(iter(common))]
    return beam_agreement(ok_a, ok_b) if "beams" in first else prefill_agreement(ok_a, ok_b)


def constrained_beams(points: Iterable[LoadPoint]) -> BeamSets:
    """The beams of each measured request sent with item codes and answered, by request id
    (a later point's answer to the same id replaces an earlier one)."""
    return {r.item.request.id: {tuple(b.token_ids) for b in r.result.beams}
            for point in points for r in point.records
            if r.status == "ok" and not r.warmup and r.item.codes is not None and hasattr(r.result, "beams")}


def beam_recall(beams: BeamSets, reference: BeamSets) -> float:
    """Mean over the requests both answered of |beams & reference's| / |reference's| (NaN when
    none was)."""
    shares = [len(got & reference[rid]) / len(reference[rid]) for rid, got in beams.items() if reference.get(rid)]
    return sum(shares) / len(shares) if shares else float("nan")
