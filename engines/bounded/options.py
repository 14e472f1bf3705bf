"""The bounded engine's settings (EngineConfig.options), parsed and checked once into a
frozen dataclass; plan.py turns them, with the bounds, into sizes."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from engines.bounded.kernels.attention import ATTENTIONS
from engines.bounded.model.precision import DTYPES, GEMM_GROUPS

COMPILE_MODES = ("aot", "eager")  # AOTInductor packages (cached), or the eager programs


class OptionError(ValueError):
    pass


@dataclass(frozen=True)
class BoundedOptions:
    compile: str = "aot"  # "aot" (AOTInductor, cached) or "eager"
    max_wait_ms: float = 2.0  # how long a batch waits for more requests after its first
    max_batch_tokens: int = 0  # packed tokens per call; 0: one full-bounds request
    max_batch_seqs: int = 0  # samples per call; 0: 8 x max_samples_per_request
    max_labels: int = 64  # distinct label ids per call
    max_batch_beams: int = 0  # beam rows per decode step (several requests' beams); 0: max(W, 512)
    residual: str = "float32"  # dtype of the residual stream (bf16 GEMMs either way)
    fp8: tuple[str, ...] = ()  # GEMM groups to run in FP8 (CUDA, compute capability >= 8.9)
    prefill_attention: str = "auto"  # packed prefill attention: auto (the device's best), per_sequence, padded
    cuda_graphs: bool = True  # on a GPU: capture the beam decode steps as CUDA graphs at start

    @classmethod
    def parse(cls, options: dict[str, Any]) -> "BoundedOptions":
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise OptionError(f"unknown bounded-engine option(s) {', '.join(unknown)}; "
                              f"known options: {', '.join(known)}")
        values = dict(options)
        if "fp8" in values:
            values["fp8"] = tuple([values["fp8"]] if isinstance(values["fp8"], str) else values["fp8"])
        try:
            for name in ("max_batch_tokens", "max_batch_seqs", "max_labels", "max_batch_beams"):
                if name in values:
                    values[name] = int(values[name])
            if "max_wait_ms" in values:
                values["max_wait_ms"] = float(values["max_wait_ms"])
            if "cuda_graphs" in values:
                values["cuda_graphs"] = _flag(values["cuda_graphs"])
        except (TypeError, ValueError) as e:
            raise OptionError(f"bounded-engine option: {e}") from e
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
        bad = [g for g in self.fp8 if g not in GEMM_GROUPS]
        if bad:
            raise OptionError(f"fp8 groups {bad}; groups are {', '.join(GEMM_GROUPS)}")
        if (self.max_wait_ms < 0 or self.max_batch_tokens < 0 or self.max_batch_seqs < 0 or self.max_labels < 1
                or self.max_batch_beams < 0):
            raise OptionError("max_wait_ms, max_batch_tokens, max_batch_seqs and max_batch_beams must be >= 0, "
                              "max_labels >= 1")


def _flag(value: Any) -> bool:
    """A yes/no option from YAML (a bool) or the command line (a string)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a yes/no value (true/false)")
