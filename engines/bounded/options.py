"""The bounded engine's settings (EngineConfig.options), parsed and checked once into a
frozen dataclass; plan.py turns them, with the bounds, into sizes."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from engines.bounded.kernels.attention import ATTENTIONS
from engines.bounded.model.precision import DTYPES, GEMM_GROUPS, LAYER_GROUPS, PRECISION_MODES

COMPILE_MODES = ("aot", "eager")  # AOTInductor packages (cached), or the eager programs
# the accuracy gate on a plan with int8/fp8 groups (tasks/gate.py): refuse it when it is further
# from float32 than bf16 by the error or the decisions; decisions: judge the top labels /
# top-W beams alone (the error is reported); accept: judge it, and serve it whatever the verdict
GATE_MODES = ("refuse", "decisions", "accept")
MAX_WAIT_MS = 10_000.0
# sizes the engine allocates buffers for at start: caps far above any bounded workload
SIZE_CAPS = {"max_batch_tokens": 1 << 22, "max_batch_seqs": 1 << 16, "max_labels": 4096, "max_batch_beams": 1 << 16}


class OptionError(ValueError):
    pass


@dataclass(frozen=True)
class BoundedOptions:
    compile: str = "aot"  # "aot" (AOTInductor, cached) or "eager"
    max_wait_ms: float = 0.0  # 0: work-conserving (an idle model starts at once); > 0: hold a batch with room up to this long
    max_batch_tokens: int = 0  # packed tokens per call; 0: one full-bounds request
    max_batch_seqs: int = 0  # samples per call; 0: 8 x max_samples_per_request
    max_labels: int = 64  # distinct label ids per call
    max_batch_beams: int = 0  # beam rows per decode step (several requests' beams); 0: max(W, 512)
    residual: str = "float32"  # dtype of the residual stream between layers
    precision: str = "auto"  # dtype to compute in: auto (the scenario's where native and fast, else float32) or a dtype
    int8: tuple[str, ...] = ()  # GEMM groups to run as W8A8 int8 (CPU): qkv, o, gate_up, down, head
    fp8: tuple[str, ...] = ()  # GEMM groups to run in FP8 (CUDA, compute capability >= 8.9)
    prefill_attention: str = "auto"  # packed prefill attention: auto (the device's best), per_sequence, padded
    cuda_graphs: bool = True  # on a GPU: capture the beam decode steps as CUDA graphs at start
    gate: str = "refuse"  # the accuracy gate's mode: GATE_MODES
    share_query: bool = True  # a query request: prefill the query once, its items share its K/V
    kernel_profile: bool = False  # compile the packages with each kernel visible to torch.profiler (bench profile)

    def gemm_kinds(self) -> dict[str, str]:
        """{group: GEMM kind} of the groups these options lower (the rest stay dense)."""
        return {**{g: "int8" for g in self.int8}, **{g: "fp8" for g in self.fp8}}

    @classmethod
    def parse(cls, options: dict[str, Any]) -> "BoundedOptions":
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise OptionError(f"unknown bounded-engine option(s) {', '.join(unknown)}; "
                              f"known options: {', '.join(known)}")
        values = dict(options)
        for name in ("int8", "fp8"):
            if name in values:
                v = values[name]
                groups = [v] if isinstance(v, str) else v or ()
                if not isinstance(groups, (list, tuple)) or not all(isinstance(g, str) for g in groups):
                    raise OptionError(f"{name}={v!r}: give a GEMM group or a list of them ({', '.join(GEMM_GROUPS)})")
                values[name] = tuple(groups)
        for name in ("compile", "residual", "precision", "prefill_attention", "gate"):
            if name in values and not isinstance(values[name], str):
                raise OptionError(f"{name}={values[name]!r}: a name is expected")
        try:
            for name, cap in SIZE_CAPS.items():
                if name in values:
                    values[name] = _whole(name, values[name], cap)
            if "max_wait_ms" in values:
                values["max_wait_ms"] = _milliseconds(values["max_wait_ms"])
            for name in ("cuda_graphs", "share_query", "kernel_profile"):
                if name in values:
                    values[name] = _flag(name, values[name])
        except (TypeError, ValueError) as e:
            raise OptionError(f"bounded-engine option {e}") from e
        opts = cls(**values)
        opts._check()
        return opts

    def _check(self) -> None:
        if self.compile not in COMPILE_MODES:
            raise OptionError(f"compile={self.compile!r}; choose one of {', '.join(COMPILE_MODES)}")
        if self.residual not in DTYPES:
            raise OptionError(f"residual={self.residual!r}; choose one of {', '.join(DTYPES)}")
        if self.prefill_attention not in ("auto", *ATTENTIONS):
            raise OptionError(f"prefill_attention={self.prefill_attention!r}; choose one of auto, "
                              f"{', '.join(ATTENTIONS)}")
        if self.precision not in PRECISION_MODES:
            raise OptionError(f"precision={self.precision!r}; choose one of {', '.join(PRECISION_MODES)}")
        if self.gate not in GATE_MODES:
            raise OptionError(f"gate={self.gate!r}; choose one of {', '.join(GATE_MODES)}")
        for name, groups, allowed in (("int8", self.int8, GEMM_GROUPS), ("fp8", self.fp8, LAYER_GROUPS)):
            bad = [g for g in groups if g not in allowed]
            if bad:
                raise OptionError(f"{name} groups {bad}; groups are {', '.join(allowed)}")
        both = sorted(set(self.int8) & set(self.fp8))
        if both:
            raise OptionError(f"groups {both} are both int8 and fp8; give each group one kind")
        if (self.max_wait_ms < 0 or self.max_batch_tokens < 0 or self.max_batch_seqs < 0 or self.max_labels < 1
                or self.max_batch_beams < 0):
            raise OptionError("max_wait_ms, max_batch_tokens, max_batch_seqs and max_batch_beams must be >= 0, "
                              "max_labels >= 1")


def _whole(name: str, value: Any, cap: int) -> int:
    """A size from YAML (an int; not a bool, not 2.7) or the command line (digits)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: a whole number is expected")
    if not 0 <= value <= cap:
        raise ValueError(f"{name}={value}: outside 0..{cap:,}")
    return value


def _milliseconds(value: Any) -> float:
    """max_wait_ms: a finite number of ms, at most MAX_WAIT_MS (NaN or inf would hold a batch forever)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        ms = float(value) if number or isinstance(value, str) else math.nan
    except ValueError:
        ms = math.nan
    if not 0 <= ms <= MAX_WAIT_MS:
        raise ValueError(f"max_wait_ms={value!r}: give milliseconds in 0..{MAX_WAIT_MS:g}")
    return ms


def _flag(name: str, value: Any) -> bool:
    """A yes/no option from YAML (a bool) or the command line (a string)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: not a yes/no value (true/false)")
