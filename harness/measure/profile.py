"""Where a request's time goes, by class: the torch.profiler events of the measured requests
sorted into GEMMs, attention, norms/elementwise and head + selection, and the rest of the
request's wall time as host time (request check + tokenize, batching wait, pack, the compiled
packages' time between their kernels, and Python between calls), so that the classes add up
to the request's time by construction, and each measured class is what the profiler saw.

Each event is attributed whole to the first class that claims it, walking down from the
roots (a claimed event's children are not visited): a profiler range the engine opens
(`bounded::attention`, `bounded::head`, `bounded::select`) claims what runs inside it,
except GEMMs, which stay GEMMs wherever they run (a head's GEMM is a GEMM with its FLOPs;
the native fused head's `head_gemm_summary_bf16` is a GEMM whose epilogue, each row's
log-sum-exp and block maxima, runs on the tile while it is in cache, and its
`head_choose_bf16` is selection); then names: GEMM externs (oneDNN linear, mm), attention ops (flash SDPA, the per-sequence
op, batched matmuls, fused softmax kernels), and any other kernel or aten op is
norms/elementwise. Wrappers that are none of these are descended into.

A compiled package's call is the range `bounded::graph`, which claims nothing itself: its
kernels are classed as any others, and the rest of its time -- the package's own code between
its kernels, each kernel's OpenMP fork and join -- is its gaps (`KernelTimes.graph_gaps`), a
part of host time apart from the Python around the calls.

A kernel Inductor fused is named after the nodes it came from, the attention's neighbours
included: the RoPE and q/k norms that feed the attention op are "..._varlen_attention_view_1"
(a fused kernel never holds an extern op). So a fused kernel is attention only for a softmax
in it (its row max), whatever else its name says; a row max beside a rounding is an int8
plan's activation quantisation (`abs_amax_clamp_div_round`): elementwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

CLASSES = ("gemm", "attention", "norms_elementwise", "head_selection", "host")
LABELS = {"gemm": "GEMMs", "attention": "attention", "norms_elementwise": "norms / elementwise / copies",
          "head_selection": "head + selection", "host": "host (outside kernels)"}
RANGES = {"bounded::attention": "attention", "bounded::head": "head_selection", "bounded::select": "head_selection"}
GRAPH = "bounded::graph"  # a compiled package's call (engines/bounded/runtime/aot.PackageCall)
GEMM_NAMES = ("linear_pointwise", "head_gemm_summary", "aten::linear", "aten::mm", "aten::addmm", "mm_out", "addmm_out", "_int_mm",
              "qlinear", "aten::_weight_int8pack_mm", "cublas", "gemm", "aten::_scaled_mm")
ATTENTION_NAMES = ("scaled_dot_product", "flash_attention", "varlen_attention", "beam_attention", "bmm", "softmax")
FUSED = ("cpp_fused", "triton_")  # Inductor's generated kernels
FUSED_ATTENTION = ("softmax", "amax")
FUSED_QUANTISE = ("round",)  # an int8 plan's activation quantisation: its row amax is a scale, not a softmax
WRAPPERS = ("aten::matmul",)  # its children say what it was: mm (a GEMM) or bmm (attention)
KERNEL_PREFIXES = ("aten::", "aoti_", "graph_", "mkldnn::", "onednn::", "quantized::", "prims::",
                   "bounded_native::", "bounded_native_f32::")  # and FUSED; native ops not named above (SwiGLU)


def classify(name: str, context: Optional[str]) -> Optional[str]:
    """The class that claims an event of this name inside a range of class `context`
    (None: outside the engine's ranges), or None: a wrapper to descend into."""
    if name in RANGES or name in WRAPPERS:
        return None
    low = name.lower()
    if any(g in low for g in GEMM_NAMES) and "bmm" not in low:
        return "gemm"
    if context is not None:
        return context
    if any(f in low for f in FUSED):
        softmax = any(a in low for a in FUSED_ATTENTION) and not any(q in low for q in FUSED_QUANTISE)
        return "attention" if softmax else "norms_elementwise"
    if any(a in low for a in ATTENTION_NAMES):
        return "attention"
    if name.startswith(KERNEL_PREFIXES):
        return "norms_elementwise"
    return None


@dataclass(frozen=True)
class KernelTimes:
    classes: dict[str, float]  # microseconds per class (CLASSES but host)
    graph_gaps: float = 0.0  # microseconds inside compiled packages' calls outside their kernels


def class_times(events: Iterable[Any]) -> KernelTimes:
    """Microseconds per class, and the compiled graphs' gaps, over profiler events
    (FunctionEvent: name, thread, cpu_children, cpu_parent, cpu_time_total), on the thread
    that ran the most of them: the engine's model thread. Other threads' events run inside it (an op's worker pool), and
    counting them too would count that time twice."""
    events = list(events)
    per_thread = [_class_times([e for e in events if getattr(e, "thread", 0) == thread])
                  for thread in {getattr(e, "thread", 0) for e in events}]
    return max(per_thread, key=lambda t: sum(t.classes.values()), default=_class_times([]))


def _class_times(events: list[Any]) -> KernelTimes:
    totals = {c: 0.0 for c in CLASSES if c != "host"}
    graphs = inside = 0.0
    stack = [(e, None, False) for e in events if e.cpu_parent is None]
    while stack:
        event, context, in_graph = stack.pop()
        cls = classify(event.name, context)
        if cls is not None:
            totals[cls] += event.cpu_time_total
            inside += event.cpu_time_total if in_graph else 0.0
            continue
        if event.name == GRAPH and not in_graph:
            graphs += event.cpu_time_total
        inner = RANGES.get(event.name, context)
        stack.extend((child, inner, in_graph or event.name == GRAPH) for child in event.cpu_children)
    return KernelTimes(totals, max(0.0, graphs - inside))


@dataclass(frozen=True)
class ClassRow:
    name: str  # a CLASSES entry, or a host part ("host: tokenize", ...)
    ms: float  # per request
    share: float  # of the request's time
    work: str = ""  # FLOPs or bytes the class moves per request, in words
    rate: str = ""  # achieved rate
    floor_ms: Optional[float] = None  # the work at the measured isolated rate / bandwidth


def host_parts(host_ms: float, stages: dict[str, float], graph_gaps_ms: float = 0.0) -> list[tuple[str, float]]:
    """Host time split by the engine's own stage times (ms per request) -- request check +
    tokenize, batching wait, pack -- and the compiled packages' time between their kernels;
    the rest is Python between calls (and the harness)."""
    named = [("check + tokenize", stages.get("tokenize", 0.0)), ("batching wait", stages.get("queue", 0.0)),
             ("pack", stages.get("pack", 0.0))]
    named = [(n, max(0.0, ms)) for n, ms in named]
    rest = max(0.0, host_ms - sum(ms for _, ms in named))
    gaps = min(max(0.0, graph_gaps_ms), rest)
    return [*named, ("graphs, between kernels", gaps), ("Python between calls", rest - gaps)]
