"""What both task runtimes share: the cache key, load (or compile) every package they
export, fall back to eager when compilation fails, warm up, and one status dict that says
which happened.

Compiling is separate from serving: `compile()` only makes sure the cached packages exist
(what `bench compile` runs ahead of time); `start()` also builds what serves requests.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from engines import toolchain
from engines.bounded.kernels import native
from engines.bounded.kernels.attention import attention_for
from engines.bounded.model.decoder import DecoderModel, load_model
from engines.bounded.model.precision import PrecisionPolicy
from engines.bounded.model.weights import fingerprint
from engines.bounded.runtime import aot
from engines.bounded.runtime.export import Export
from engines.hardware import cpu_flags

# freezing: the weights become constants of the package, prepacked for oneDNN (+3-5 % on
# prefill-sized GEMMs; the M = W row GEMMs of a beam step ~20 % faster than aten's
# plain-layout matmul on this CPU)
INDUCTOR_CONFIGS: dict[str, Any] = {"freezing": True}


# A float32 plan's layers with no more than this hidden size (the tiny models) compile
# without freezing: see unfrozen_for_prefill.
SMALL_HIDDEN = 256


def unfrozen_for_prefill(device: torch.device, policy: PrecisionPolicy, hidden: int) -> bool:
    """Compile a prefill package without freezing (`hidden`: the model's hidden size)? On a
    CPU with AMX in a plan of dense bf16 GEMMs: there the frozen graph's oneDNN inner product on
    the prepacked constants runs slower than oneDNN's matmul on the plain weights the
    unfrozen graph passes (ONEDNN_VERBOSE, the same brg_matmul AMX kernel: prefill_15's
    GEMMs 1,180 vs 740 ms a request on 2026-12-03, the constants then 16 bytes off their
    cache lines; aligned (aligned.py), 1,278 vs 1,091 ms for two requests on 2026-12-06),
    while at the beam step's 100 rows freezing stays ahead (100 vs 115 ms). int8 groups need
    freezing (it lowers them to oneDNN's qlinear); without AMX freezing is the faster form --
    but for a float32 plan of a tiny model, whose GEMMs (K = 64, 128) are mostly the call's
    fixed cost, which aten's mm (MKL) has less of than the prepacked oneDNN linear: [384, 64]
    x [64, 256] and [384, 128] x [128, 64], 45.5 / 28.0 against 67.5 / 36.7 us, and `bench run
    scenarios/tiny_scoring.yaml --engine bounded --requests 300` 1.5 / 2.1 ms against 2.2 / 2.4
    frozen, alternated (an Emerald Rapids with AMX hidden, 2026-12-07)."""
    if device.type != "cpu":
        return False
    if policy.low_precision_groups():
        return False
    if policy.dtype == "float32":
        return hidden <= SMALL_HIDDEN
    return policy.dtype == "bfloat16" and "amx_bf16" in cpu_flags()


Graph = Callable[..., Any]

# A CPU call of less work than this runs on the calling thread alone: splitting each of its
# small kernels across the OpenMP team costs more in fork/join barriers than it saves, and a
# team member a busy core has descheduled stalls them all. It was 2e8, which put the tiny
# model's 15-sample scoring call (~0.07 GFLOP) on one thread (a Zen 3: 2.5 ms on one, 11 on
# two with the other core busy). Since the rate probes stopped leaving an OpenMP team on the
# caller's thread (engines/hardware.on_own_thread), two threads win there: Emerald Rapids
# with AMX hidden, `bench run scenarios/tiny_scoring.yaml --engine bounded --requests 300`,
# alternated: c=1 2.6 / 1.9 ms against 3.5 / 2.8 on one thread, c=4 534 / 542 against
# 340 / 464 requests/s (2026-12-07); a Xeon with AMX, the same alternation: c=1 1.5 / 1.5
# against 1.8 / 2.0 ms.
SERIAL_FLOPS = 2e7
# ... but while the host has other work (requests queued behind the call or merged into it:
# `host_busy`), calls of less than this stay on one thread, leaving the other core to the
# callers, the request checks and the event loop: under Poisson arrivals a two-thread team
# whose worker the callers preempt stalls at every barrier. A Xeon with AMX, `bench run
# scenarios/tiny_scoring.yaml --engine bounded --find-max-qps --requests 100`, alternated
# (2026-12-07): every call of 2e7 FLOPs and up on two threads 374 / 404 requests/s under the
# 20 ms SLO, 2e8 as the bound for all 469 / 537; later, slower, this rule against 2e7 for all
# 413 / 489 vs 254 / 285. Its cost: four closed-loop callers (whose side idles while a call
# runs) read 488 / 492 requests/s against 547 / 551; a lone caller's 2.2-2.3 ms did not move.
SERIAL_FLOPS_BUSY = 2e8
# ... unless it streams more than this from memory: one core's share of the bandwidth is then
# the bound (a beam's first step: the 19 MB head weight for one row, usually fetched from DRAM
# again after the request's other work; Zen 4: 1.8 ms on one thread, 0.9 on two).
SERIAL_BYTES = 4 * 2**20


class _Host(threading.local):
    busy = False  # set by the batcher around each call on its model thread (host_busy)


_host = _Host()


@contextlib.contextmanager
def host_busy(busy: bool) -> Iterator[None]:
    """Declare, for the calls the enclosed code makes on this thread, whether the host has
    other work now (tasks/batcher.py: requests waiting or merged into the call)."""
    before, _host.busy = _host.busy, busy
    try:
        yield
    finally:
        _host.busy = before


@contextlib.contextmanager
def threads_for(device: torch.device, flops: float, nbytes: float = 0) -> Iterator[None]:
    """Run the enclosed CPU work on one thread when it is smaller than SERIAL_FLOPS
    (SERIAL_FLOPS_BUSY while the host is busy: `host_busy`) and reads less than SERIAL_BYTES."""
    limit = SERIAL_FLOPS_BUSY if _host.busy else SERIAL_FLOPS
    if device.type != "cpu" or flops >= limit or nbytes >= SERIAL_BYTES:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class CompiledRuntime:
    """Subclasses say what to compile (`exports`), what runs eagerly (`eager_graphs`), how to
    size the rotary tables (`max_positions`) and what to build once graphs exist (`serve`)."""

    step_attention = ""  # the beam runtime's decode-step attention (part of the cache key)

    def __init__(self, model_dir: Path, policy: PrecisionPolicy, device: str, compile_mode: str = "aot",
                 log: Callable[[str], None] = print, attention: str = "auto", max_sequences: Optional[int] = None,
                 max_len: Optional[int] = None, kernel_profile: bool = False):
        """`attention`: the packed prefill's attention (kernels/attention.ATTENTIONS), or
        "auto": the device's best for batches of up to `max_sequences` sequences (None: many)
        of up to `max_len` tokens (None: long). `kernel_profile`: packages whose every kernel
        shows in torch.profiler (their own cache entries; `bench profile`)."""
        self.inductor = {**INDUCTOR_CONFIGS, **({"cpp.enable_kernel_profile": True} if kernel_profile else {})}
        self.model_dir, self.policy, self.log = Path(model_dir), policy, log
        self.device, self.requested = torch.device(device), compile_mode
        # the native CPU kernels (kernels/native.py: attention, SwiGLU, the beam head) serve bf16;
        # built here, not on a request
        self.native = self.device.type == "cpu" and policy.dtype == "bfloat16" and native.load(log)
        # float32 plans: the AVX2 attention kernels (csrc/varlen_attention_f32.cpp), called by
        # the graphs as the bf16 ones are
        library = native.F32 if policy.dtype == "float32" else native.BF16
        use_native = self.native or (self.device.type == "cpu" and library is native.F32 and library.load(log))
        self.attention = attention_for(self.device, max_sequences, max_len, use_native) \
            if attention == "auto" else attention
        if self.attention == "native" and not use_native:
            raise ValueError("prefill_attention=native needs a CPU where the native kernel of the plan's dtype loads "
                             "(bf16: AVX512-BF16; float32: AVX2 + FMA): "
                             f"{library.status() if self.device.type == 'cpu' else self.device.type}")
        self.status: dict[str, Any] = {"compile": compile_mode, "compile_requested": compile_mode,
                                       "prefill_attention": self.attention}
        if self.device.type == "cpu":
            self.status["native_kernels"] = library.status()
        self._model: Optional[DecoderModel] = None
        self._compiled: Optional[dict[str, Graph]] = None

    # --- subclass hooks ------------------------------------------------------------------

    def max_positions(self) -> int:
        raise NotImplementedError

    def exports(self) -> list[Export]:
        raise NotImplementedError

    def eager_graphs(self) -> dict[str, Graph]:
        raise NotImplementedError

    def serve(self, graphs: dict[str, Graph], compiled: bool) -> None:
        raise NotImplementedError

    # --- shared --------------------------------------------------------------------------

    def model(self) -> DecoderModel:
        """The eager model (weights loaded on first use)."""
        if self._model is None:
            self._model = load_model(self.model_dir, self.policy, self.device, self.max_positions())
        return self._model

    def key(self, name: str, shapes: Any) -> aot.CompileKey:
        p = self.policy
        return aot.CompileKey(name, fingerprint(self.model_dir), p.dtype, p.residual,
                              p.cache_tag(),
                              aot.device_tag(self.device), torch.__version__, shapes,
                              inductor=json.dumps(self.inductor, sort_keys=True), attention=self.attention,
                              native=self.native, step_attention=self.step_attention)

    def compile(self) -> dict[str, Any]:
        """Load every package, compiling those the cache lacks. -> the status."""
        exports = self.exports()
        if any(not self.key(e.name, e.shapes).package_path().is_file() for e in exports):
            missing = toolchain.missing(self.device.type)
            if missing:  # say what is missing, not the compiler's first error
                raise toolchain.ToolchainMissing(f"AOT toolchain for {self.device.type}: {'; '.join(missing)}")
        graphs, packages = {}, {}
        # a GPU package runs single-threaded: AOTInductor's own thread handling cannot run
        # under CUDA graph capture ("operation not permitted when stream is capturing")
        single = self.device.type == "cuda"
        for e in exports:
            key = self.key(e.name, e.shapes)
            loaded = aot.load_or_compile(key, e.build, e.example, e.dims, self.log, self.inductor,
                                         single_threaded=single)
            graphs[e.name] = loaded.runner
            packages[e.name] = {"package": str(loaded.path), "compiled_now": loaded.compiled_now,
                                "load_s": round(loaded.seconds, 2), "key": key.digest()}
        self._compiled = graphs
        self.status.update(compile="aot", packages=packages)
        return dict(self.status)

    def start(self) -> None:
        """The packages (or, if they cannot be had, the eager programs), then `serve`."""
        if self.requested == "aot" and self._compiled is None:
            try:
                self.compile()
            except Exception as e:  # no compiler, unsupported op, ...: serve eagerly
                reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                self.log(f"AOT compilation of {type(self).__name__} failed, falling back to eager: {reason}")
                self.status.update(compile="eager", fallback_reason=reason)
        compiled = self._compiled is not None
        self.serve(self._compiled if compiled else self.eager_graphs(), compiled)
        if compiled:
            self._model = None  # the packages hold their own weights

    def warm_up(self, call: Callable[[], Any]) -> None:
        """Run one small call now, so first-call initialisation stays off the request path."""
        t0 = time.perf_counter()
        call()
        self.status["warmup_s"] = round(time.perf_counter() - t0, 3)
