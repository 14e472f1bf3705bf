"""The engine interface every engine implements, and the request/result types it speaks.

An engine knows nothing of scenarios, load or reports: it is handed a model directory,
its bounds and a dtype/device, then business requests one at a time (possibly
concurrently) through `submit`.
"""
from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

Sample = Union[str, Sequence[int]]
Label = Union[str, int]

PREFILL_ONLY = "prefill_only"
BEAM_SEARCH = "beam_search"
TASK_KINDS = (PREFILL_ONLY, BEAM_SEARCH)


class EngineError(Exception):
    """An engine could not serve a request (the engine itself keeps serving)."""


class RequestRejected(EngineError):
    """A request is outside the engine's declared bounds or malformed."""


class EngineDied(EngineError):
    """The engine is gone (e.g. its server process exited): every further request would
    fail the same way, so the harness should end this engine's run instead of recording
    one error per remaining request."""


class EngineUnavailable(Exception):
    """The engine cannot run on this machine (missing package, no server, no device)."""


@dataclass(frozen=True)
class PrefillRequest:
    """Score each sample: softmax over `labels` of the next-token logits at its last position.

    Or a query and its items (`query` given, `samples` empty): sample i is the concatenation
    query + items[i] (token ids concatenated; text joined into one string, then tokenized),
    scored like any sample. Engines may compute the query's K/V once and share it between the
    items; the answer must equal scoring the concatenations. Build one with `with_query`.
    """

    id: str
    samples: Sequence[Sample]
    labels: Sequence[Label]
    kind: str = PREFILL_ONLY
    query: Optional[Sample] = None
    items: Sequence[Sample] = ()

    @classmethod
    def with_query(cls, id: str, query: Sample, items: Sequence[Sample],
                   labels: Sequence[Label]) -> "PrefillRequest":
        return cls(id, (), labels, query=query, items=items)

    @property
    def has_query(self) -> bool:
        return self.query is not None

    @property
    def num_samples(self) -> int:
        """Samples to score: the items of a query request, else the samples."""
        return len(self.items) if self.has_query else len(self.samples)


@dataclass(frozen=True)
class BeamRequest:
    """Generate exactly `decode_steps` tokens with beam width `beam_width` (EOS masked).

    `allowed`, when given, is a list of token-id sequences (item codes); every beam must
    stay on a prefix of one of them. Engines may cache structures derived from it by
    `id(allowed)`: the harness passes the same object for requests sharing the codes.
    """

    id: str
    prompt: Sample
    beam_width: int
    decode_steps: int
    allowed: Sequence[Sequence[int]] | None = None
    kind: str = BEAM_SEARCH


Request = Union[PrefillRequest, BeamRequest]


@dataclass
class PrefillResult:
    id: str
    scores: list[list[float]]  # [samples][labels], each row sums to 1
    stages: dict[str, float] = field(default_factory=dict)  # stage name -> ms


@dataclass
class Beam:
    token_ids: list[int]  # the generated tokens only
    text: str
    logprob: float  # cumulative log-probability of the generated tokens


@dataclass
class BeamResult:
    id: str
    beams: list[Beam]  # best first
    stages: dict[str, float] = field(default_factory=dict)


Result = Union[PrefillResult, BeamResult]


@dataclass(frozen=True)
class Bounds:
    """What the engine must be ready for; allocate from this at start."""

    max_samples_per_request: int = 16  # samples, or items of a query request
    max_prompt_tokens: int = 512  # a sample or beam prompt
    max_beam_width: int = 400
    max_decode_steps: int = 5
    on_violation: str = "reject"  # or "truncate": cut samples/prompts to the bounds (keeping their ends)
    max_query_tokens: int = 512  # the query of a query request
    max_item_tokens: int = 512  # each item of a query request (query + item: a sample, within max_prompt_tokens)


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    dtype: str = "bfloat16"  # "bfloat16" | "float32" | "float16"
    device: str = "cpu"  # "cpu" | "cuda" | "cuda:N"
    bounds: Bounds = Bounds()
    task_kind: str | None = None  # the task an engine may specialise for; None = both
    options: dict[str, Any] = field(default_factory=dict)  # engine-specific settings


@dataclass(frozen=True)
class Precision:
    """What an engine's GEMMs compute in. `low_precision`: some GEMM group runs below float
    (int8/fp8), so its effective MFU, counted at the float FLOPs against the float peak, may
    pass 100 %. `gate_failed`: the accuracy gate found such a plan further from float32 than
    bf16 and the plan was kept anyway."""

    dtype: str  # the dtype the GEMMs compute in (may differ from the one asked for)
    summary: str = ""  # in a few words, e.g. "bfloat16 + int8 [mlp]"; default: dtype
    why: str = ""  # how `dtype` was chosen from the dtype asked for
    low_precision: bool = False
    gate_failed: bool = False

    @property
    def label(self) -> str:
        """The precision as tables and reports print it."""
        return (self.summary or self.dtype) + (" (accuracy gate: further from float32 than bf16, accepted)"
                                               if self.gate_failed else "")


@dataclass(frozen=True)
class Description:
    """What an engine says of itself, once started: the fields the harness reads (the runner's
    MFU and emulation warnings, the summary table, the report, `bench doctor`), and `details`,
    engine-specific settings recorded in run.json that the harness never reads."""

    engine: str
    device: str
    dtype: str  # the dtype asked for (the scenario's)
    precision: Precision
    version: str | None = None
    mode: str = ""  # how it serves, e.g. "aot + CUDA graphs", "eager (AOT failed)", "launch"
    fallback: str | None = None  # why it serves otherwise than asked; None when it does as asked
    cuda_graphs: str = "not used"  # "captured", "failed" or "not used"
    plan: str = ""  # the plan it sized from its bounds, in a few words
    details: Mapping[str, Any] = field(default_factory=dict)

    def with_details(self, **more: Any) -> "Description":
        return replace(self, details={**self.details, **more})

    def to_dict(self) -> dict[str, Any]:
        """For run.json and /server_info: the details, then the typed fields (the names the
        report's `from_dict` reads back)."""
        return {**self.details, "name": self.engine, "version": self.version, "device": self.device,
                "dtype": self.dtype, "compute_dtype": self.precision.dtype, "precision": asdict(self.precision),
                "mode": self.mode, "fallback": self.fallback, "cuda_graphs": self.cuda_graphs, "plan": self.plan}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Description":
        """A description read back from run.json, this layout or the older one (a free-form
        dict whose "precision" held the bounded engine's policy and its accuracy gate)."""
        dtype = str(d.get("compute_dtype") or d.get("dtype") or "?")
        p = d.get("precision") if isinstance(d.get("precision"), dict) else {}
        if "low_precision" in p:
            precision = Precision(**{k: p[k] for k in ("dtype", "summary", "why", "low_precision", "gate_failed")})
        else:
            gates = p.get("accuracy_gate")
            failed = isinstance(gates, dict) and any(isinstance(v, dict) and not v.get("passed")
                                                     for v in gates.values())
            low = any(k not in ("dense", None) for k in (p.get("gemm") or {}).values())
            precision = Precision(dtype, str(p.get("summary") or ""), str(p.get("why") or ""), low,
                                  bool(p.get("summary")) and failed)
        typed = {"name", "version", "device", "dtype", "compute_dtype", "precision", "mode", "fallback",
                 "cuda_graphs", "plan"}
        return cls(str(d.get("name") or "?"), str(d.get("device") or "?"), str(d.get("dtype") or "?"), precision,
                   d.get("version"), str(d.get("mode") or ""), d.get("fallback"),
                   str(d.get("cuda_graphs") or "not used"), str(d.get("plan") or ""),
                   {k: v for k, v in d.items() if k not in typed})


def as_samples(request: PrefillRequest) -> PrefillRequest:
    """A query request as plain samples: its concatenations (text joined, ids concatenated)."""
    if not request.has_query:
        return request
    if request.samples:
        raise RequestRejected("give samples, or query + items, not both")
    text = isinstance(request.query, str)
    if not request.items or any(isinstance(item, str) != text for item in request.items):
        raise RequestRejected("a query request needs items, all text or all token ids like its query")
    if text:
        samples = [request.query + item for item in request.items]
    else:
        samples = [list(request.query) + list(item) for item in request.items]
    return PrefillRequest(request.id, samples, request.labels)


class Engine(abc.ABC):
    """One engine instance. `start` before `submit`; `stop` releases everything."""

    name: str = "engine"
    computes: bool = True  # False for engines that skip the model (MFU is then meaningless)
    # True if `submit` takes query requests (PrefillRequest.with_query); an engine that does
    # not is handed their concatenations instead (engines.registry.create_engine)
    takes_query_requests: bool = False

    def __init__(self, config: EngineConfig):
        self.config = config

    @abc.abstractmethod
    def start(self) -> None: ...

    def stop(self) -> None:
        pass

    def resize(self, bounds: Bounds) -> bool:
        """Take new bounds without a restart, if nothing was planned from them at start (the
        engine only checks requests against them) -> whether it did. Default: it cannot."""
        return False

    def describe(self) -> Description:
        """What the engine says of itself; by default: it computes in the dtype asked for."""
        dtype = self.config.dtype
        return Description(self.name, self.config.device, dtype, Precision(dtype),
                           details={"options": dict(self.config.options)})

    @abc.abstractmethod
    async def submit(self, request: Request) -> Result: ...

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Raise ValueError naming the bad option if `options` are not this engine's (checked
        when a scenario is loaded, before any engine starts). By default an engine takes none."""
        if options:
            raise ValueError(f"unknown option(s) {', '.join(sorted(map(str, options)))}: engine {cls.name!r} "
                             "takes no options")

    @classmethod
    def check_available(cls, config: EngineConfig) -> None:
        """Raise EngineUnavailable with a one-line reason if this engine cannot run here."""
