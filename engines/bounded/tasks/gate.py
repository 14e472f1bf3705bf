"""The accuracy gate of a low-precision plan (int8 or fp8 GEMM groups).

On a seeded calibration batch each served task answers three ways: with the plan being
judged (its compiled packages, as it will serve), and eagerly with the engine's own float32
and bf16 paths. The plan's distance from float32 is compared with bf16's: scoring by the
mean |label-probability difference| and the share of samples with the same top label,
beams by the top-W overlap. A plan further from float32 than bf16 on any of them is refused
with a message that names its groups -- unless the `gate: accept` option says to serve it.
The verdict is cached beside the packages (keyed by them), so a restart does not re-judge.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from engines.base import EngineUnavailable
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.runtime import aot


class PlanRefused(EngineUnavailable):
    """The accuracy gate refused the engine's precision plan."""


@dataclass(frozen=True)
class Distance:
    """How far one path's answers are from float32's on the calibration batch."""

    error: float  # scoring: mean |delta p| over labels; beams: mean |delta log-prob| on shared beams
    max_error: float
    agreement: float  # scoring: share of samples with the same top label; beams: mean top-W overlap
    error_judged: bool = True  # beams are judged by their overlap alone (their error is reported)

    def worse_than(self, other: "Distance", judge_error: bool = True) -> list[str]:
        """How this path is further from float32 than `other` (bf16) is; empty: it is not.
        `judge_error=False` judges the decisions alone (top label, top-W beams)."""
        out = []
        if judge_error and self.error_judged and self.error > other.error:
            out.append(f"error {self.error:.3g} > bf16's {other.error:.3g}")
        if self.agreement < other.agreement:
            out.append(f"agreement {self.agreement:.1%} < bf16's {other.agreement:.1%}")
        return out


@dataclass(frozen=True)
class Verdict:
    task: str
    plan: str  # the policy summary
    plan_vs_fp32: Distance
    bf16_vs_fp32: Distance
    seconds: float

    def worse(self, mode: str = "refuse") -> list[str]:
        """How the plan is further from float32 than bf16 under the gate `mode` (refuse: by
        the error and the decisions; decisions: by the top labels / top-W beams alone)."""
        return self.plan_vs_fp32.worse_than(self.bf16_vs_fp32, judge_error=mode != "decisions")

    def describe(self, mode: str = "refuse", cached: bool = False) -> dict[str, Any]:
        worse = self.worse(mode)
        return {"task": self.task, "plan": self.plan, "mode": mode, "passed": not worse, "worse": worse,
                "plan_vs_float32": asdict(self.plan_vs_fp32), "bfloat16_vs_float32": asdict(self.bf16_vs_fp32),
                "seconds": round(self.seconds, 1), "cached": cached}


def judge(task: Any, make_reference: Callable[[PrecisionPolicy], Any], policy: PrecisionPolicy) -> Verdict:
    """task: the started Task serving `policy`; make_reference(policy) -> a started eager
    Task of the same kind for a reference policy. -> the verdict on the calibration batch."""
    t0 = time.perf_counter()
    items = task.calibration_items()
    plan = _answers(task, items)
    fp32 = _answers(make_reference(policy.with_dtype("float32")), items)
    bf16 = _answers(make_reference(policy.with_dtype("bfloat16")), items)
    return Verdict(task.kind, policy.summary(), task.distance(fp32, plan), task.distance(fp32, bf16),
                   time.perf_counter() - t0)


def _answers(task: Any, items: list[Any]) -> list[Any]:
    return [r for it in items for r in task.run([it], {})]  # one call per item: within any budget


def cache_path(task: Any) -> Any:
    """The verdict's file: keyed by the task's package keys (model, dtypes, GEMM kinds, code,
    torch, shapes), the head's kind and how the plan is served (aot, or eager where it fell
    back: the compiled and eager int8 paths are different kernels)."""
    rt = task.runtime
    keys = [rt.key(e.name, e.shapes).digest() for e in rt.exports()]
    tag = json.dumps({"packages": keys, "head": rt.policy.gemm_kind("head"), "serving": rt.status.get("compile"),
                      "gate": 1})
    return aot.cache_root() / f"gate-{task.kind}-{hashlib.sha256(tag.encode()).hexdigest()[:16]}.json"


def check(task: Any, make_reference: Callable[[PrecisionPolicy], Any], policy: PrecisionPolicy, mode: str,
          log: Callable[[str], None]) -> dict[str, Any]:
    """Judge (or read the cached verdict on) the task's plan; raise PlanRefused when it is
    further from float32 than bf16 under `mode` (refuse | decisions), unless `mode` is
    accept. -> the verdict for describe()."""
    path = cache_path(task)
    cached = path.is_file()
    if cached:
        data = json.loads(path.read_text())
        verdict = Verdict(data["task"], data["plan"], Distance(**data["plan_vs_float32"]),
                          Distance(**data["bfloat16_vs_float32"]), data["seconds"])
    else:
        log(f"accuracy gate: {policy.summary()} against this engine's float32 and bf16 paths "
            f"on a calibration batch ({task.kind}) ...")
        verdict = judge(task, make_reference, policy)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(verdict.describe(), indent=1))
    judged = "refuse" if mode == "accept" else mode
    worse = verdict.worse(judged)
    d, b = verdict.plan_vs_fp32, verdict.bf16_vs_fp32
    log(f"accuracy gate ({task.kind}, {verdict.plan}, {judged}): vs float32 error {d.error:.3g} agreement "
        f"{d.agreement:.1%}; bf16 {b.error:.3g} / {b.agreement:.1%}: "
        f"{'further from float32 than bf16' if worse else 'passed'}" + (" (cached)" if cached else ""))
    if worse and mode != "accept":
        groups = ", ".join(f"{g}={k}" for g, k in policy.low_precision_groups().items())
        raise PlanRefused(f"precision plan {verdict.plan} ({groups}) is further from float32 than bf16 "
                          f"on the {task.kind} calibration batch: {'; '.join(worse)}. Lower fewer groups, "
                          "or set the engine option gate: decisions (judge the top labels / beams alone) "
                          "or gate: accept (serve it anyway)")
    return {**verdict.describe(judged, cached), "accepted": bool(worse)}
