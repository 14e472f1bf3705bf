"""Causal attention within each sequence of a packed prefill batch, four ways (ATTENTIONS):

- "native" (CPU: bf16 with AVX512-BF16, float32 with AVX2 + FMA; "auto" wherever it loads):
  the native kernel called by the graph itself (native.NativeAttention).
- "per_sequence" (CPU): `varlen_attention`, an opaque op for torch.export/Inductor (the graph
  around it is compiled) that reads the sequence offsets on the host, a CPU's. Its body: the
  native kernel of the dtype where it loads (Zen 4, bf16, 2 threads, a layer of 15 x ~96
  tokens, qwen3-0.6b's heads: 3.3 ms against the Python body's 10.1), else Python: a small
  GEMM pair per sequence on single-threaded workers. A sequence may also see the whole
  of an earlier one, its prefix: a query whose K/V its items share (query_attention.py).
- "padded" (GPU; on a CPU the beam prefill of a few prompts, see `attention_for`):
  `packed_attention_padded`, plain tensor ops that compile into the graph: gather the
  packed rows into an [S, L] padded view with the batch's device-side indices (built once
  per batch by the packer), one flash SDPA, gather back: no host sync in the graph, one
  kernel per layer. It shares a query through the indices alone: an item's padded row is its
  query's rows then its own (runtime/buffers.py), the causal mask that of the concatenation.
- "dense" (CPU, short sequences): `packed_attention_dense`, the same padded view with the
  attention written out -- float32 scores of a batched matmul, a causal bias, softmax, a
  batched matmul -- which Inductor compiles into two GEMMs and one fused softmax: on
  sequences of a few dozen tokens the CPU's flash kernel costs ~0.5 ms a call in set-up
  alone (the tiny model's 15 samples of 16-32 tokens: 0.5 ms vs ~0.05 ms a layer).

Shapes: T packed tokens, S sequences, L the longest sequence (with its prefix) of a batch,
Hq query heads, Hkv K/V heads, D head dim.
"""
from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.bounded.kernels import native
from engines.bounded.kernels.query_attention import Span, Unit, attend_items, attention_units, head_rows

ATTENTIONS = ("per_sequence", "padded", "dense", "native")


# On a CPU the padded flash kernel beats the per-sequence op where a batch holds few
# sequences (measured here, 2 cores, bf16, per layer: 1 x 32 tokens 0.20 vs 0.59 ms, 5 x
# 24-40 tokens 1.35 vs 2.88 ms, 1 x 400 tokens 7.7 vs 12.5 ms: the op's host-side work per
# call dominates short sequences), and loses where many sequences of unequal lengths pad a
# lot (15 x 48-160 tokens: 33.2 vs 26.6 ms).
FEW_SEQUENCES = 8
# Where every sequence is short, however many, the dense form (a padded view, attention
# written out): padding a sequence to at most 64 tokens wastes little, while the per-sequence
# op's host work and the flash kernel's set-up are most of a short sequence's cost.
SHORT_SEQUENCES = 64


def attention_for(device: torch.device, max_sequences: Optional[int] = None, max_len: Optional[int] = None,
                  native: bool = False) -> str:
    """The prefill attention a device runs best for batches of up to `max_sequences`
    sequences (None: many) of up to `max_len` tokens (None: long): padded on a GPU; on a CPU
    the native kernel where it serves (`native`: the plan dtype's library loaded), else dense
    for short sequences, padded for a few long ones (the beam prefill's prompts), per
    sequence otherwise (prefill scoring's long samples)."""
    if torch.device(device).type != "cpu":
        return "padded"
    if native:
        return "native"
    if max_len is not None and max_len <= SHORT_SEQUENCES:
        return "dense"
    return "padded" if max_sequences is not None and max_sequences <= FEW_SEQUENCES else "per_sequence"


def packed_attention(kind: str, cu_seqlens: Tensor, pad_index: Tensor, unpad_index: Tensor,
                     prefix: Optional[Tensor] = None) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """attend(q, k, v) -> [T, Hq*D] over one packed batch's metadata (PackedBatch), by kind;
    `prefix`: each sequence's prefix, -1 for none (the padded kind reads it from its indices)."""
    if kind == "padded":
        return lambda q, k, v: packed_attention_padded(q, k, v, pad_index, unpad_index)
    if kind == "dense":
        return lambda q, k, v: packed_attention_dense(q, k, v, pad_index, unpad_index)
    if kind == "per_sequence":
        return lambda q, k, v: varlen_attention(q, k, v, cu_seqlens, prefix)
    if kind == "native":
        if not (native.available() or native.F32.available()):
            raise ValueError(f"attention 'native' needs a native CPU kernel ({native.status()}; {native.F32.status()})")
        return native.NativeAttention(cu_seqlens, prefix)
    raise ValueError(f"attention {kind!r}; choose one of {', '.join(ATTENTIONS)}")


def packed_attention_padded(q: Tensor, k: Tensor, v: Tensor, pad_index: Tensor,
                            unpad_index: Tensor) -> Tensor:
    """Causal attention within each packed sequence, as one batched SDPA over a padded view.

    q: [T, Hq, D], k/v: [T, Hkv, D]; pad_index: [S, L] packed row of (sequence, position),
    the prefix's rows first where a sequence has one, positions past a sequence's end point
    at any of its rows; unpad_index: [T] row of the flattened [S*L] padded output for each
    packed token. Causality keeps every real query away from the padding keys, so no mask is
    needed. Returns [T, Hq*D].
    """
    s, l = pad_index.shape
    qp = q[pad_index].transpose(1, 2)  # [S, Hq, L, D]
    kp = k[pad_index].transpose(1, 2)  # [S, Hkv, L, D]
    vp = v[pad_index].transpose(1, 2)
    o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
    o = o.transpose(1, 2).reshape(s * l, -1)  # [S*L, Hq*D]
    return o[unpad_index]


def packed_attention_dense(q: Tensor, k: Tensor, v: Tensor, pad_index: Tensor, unpad_index: Tensor) -> Tensor:
    """`packed_attention_padded` written out (no flash kernel): q [T, Hq, D], k/v [T, Hkv, D]
    -> [T, Hq*D]. The g query heads of a K/V head are stacked (no K/V repeat); scores and
    softmax in float32, as the per-sequence op computes them."""
    s, l = pad_index.shape
    hkv, d = k.shape[1], k.shape[2]
    g = q.shape[1] // hkv
    qp = q[pad_index].view(s, l, hkv, g, d).permute(0, 2, 3, 1, 4)  # [S, Hkv, g, L, D]
    kp = k[pad_index].permute(0, 2, 3, 1)[:, :, None]  # [S, Hkv, 1, D, L]
    vp = v[pad_index].transpose(1, 2)[:, :, None]  # [S, Hkv, 1, L, D]
    scores = torch.matmul(qp.float(), kp.float()) * d ** -0.5  # [S, Hkv, g, L, L]
    pos = torch.arange(l, device=q.device)
    causal = torch.where(pos[None, :] <= pos[:, None], 0.0, float("-inf"))  # [L, L]
    p = torch.softmax(scores + causal, dim=-1).to(v.dtype)
    o = torch.matmul(p, vp).permute(0, 3, 1, 2, 4)  # [S, L, Hkv, g, D]
    return o.reshape(s * l, -1)[unpad_index]


def varlen_attention_cpu(q: Tensor, k: Tensor, v: Tensor, spans: list[tuple[int, int]],
                         prefix: Optional[list[int]] = None, fp32_scores: bool = True) -> Tensor:
    """Causal attention of each packed sequence (and of each query's items against it, see
    query_attention.py), with batched GEMMs per sequence.

    The g query heads sharing a kv head are stacked into one [g*n, D] matrix (no K/V
    repeat); the causal mask is an additive bias, softmax in float32. On many sequences of
    unequal lengths it beats the flash kernel over a padded view (no padding; see
    FEW_SEQUENCES for where it does not).
    `fp32_scores` computes Q K^T from float32 copies (bf16 GEMM output would round the
    logits). The work (units: a sequence, or a run of a query's items) is shared out to one
    single-threaded worker per intra-op thread: the per-sequence ops are too small to split
    well across OpenMP threads, and a spinning OpenMP team stalls badly when another process
    holds a core. q: [T, Hq, D], k/v: [T, Hkv, D] -> [T, Hq*D].
    """
    t, hq, d = q.shape
    out = torch.empty(t, k.shape[1], hq // k.shape[1], d, dtype=q.dtype, device=q.device)
    threads = torch.get_num_threads()
    groups, longest = _layout(tuple(spans), None if prefix is None else tuple(prefix), threads)
    bias = _causal_bias(longest, q.device)
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def run(group: list[Unit]) -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):  # thread-local modes
            for unit in group:
                _run_unit(out, q, k, v, unit, bias, fp32_scores)

    if len(groups) == 1:
        run(groups[0])
    else:
        list(_workers(len(groups)).map(run, groups))
        torch.set_num_threads(threads)  # see _single_threaded
    return out.view(t, hq * d)


@functools.lru_cache(maxsize=8)
def _layout(spans: tuple[Span, ...], prefix: Optional[tuple[int, ...]], threads: int) -> tuple[list[list[Unit]], int]:
    """The workers' shares and the longest span of one batch: every layer of a call asks
    for the same batch, so it is worked out once, not once per layer."""
    return _balance(attention_units(list(spans), None if prefix is None else list(prefix), threads), threads), \
        max(e - s for s, e in spans)


@functools.lru_cache(maxsize=2)  # a batch's layers hit it; batches rarely share a longest span
def _causal_bias(longest: int, device: torch.device) -> Tensor:
    """[L, L] float32 additive causal mask (-inf above the diagonal), shared read-only by the
    layers and batches with that longest span."""
    with torch.inference_mode(False):  # a normal tensor: usable in and out of inference mode
        return torch.full((longest, longest), float("-inf"), device=device).triu_(1)


def _run_unit(out: Tensor, q: Tensor, k: Tensor, v: Tensor, unit: Unit, bias: Tensor, fp32: bool) -> None:
    s, e = unit.span
    if unit.own:
        out[s:e] = _attend_one(q[s:e], k[s:e], v[s:e], bias, fp32)
    if unit.items:
        attend_items(out, q, k, v, unit, bias, fp32)


def _attend_one(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, fp32_scores: bool) -> Tensor:
    # one sequence: q [n, Hq, D], k/v [n, Hkv, D] -> [n, Hkv, g, D]
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qs = head_rows(q, hkv)
    ks, vs = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, n, D]
    if fp32_scores:
        qs, ks = qs.float(), ks.float()
    scores = torch.matmul(qs, ks.transpose(1, 2)).view(hkv, g, n, n)
    scores = torch.add(bias[:n, :n], scores, alpha=d ** -0.5)  # float32
    p = torch.softmax(scores, dim=-1).to(v.dtype).view(hkv, g * n, n)
    return torch.matmul(p, vs).view(hkv, g, n, d).permute(2, 0, 1, 3)


def _balance(units: list[Unit], parts: int) -> list[list[Unit]]:
    """Largest-first assignment of units to `parts` groups by attention work."""
    parts = max(1, min(parts, len(units)))
    groups: list[list[Unit]] = [[] for _ in range(parts)]
    load = [0] * parts
    for unit in sorted(units, key=lambda u: -u.work):
        i = load.index(min(load))
        groups[i].append(unit)
        load[i] += unit.work
    return groups


_WORKERS: dict[int, ThreadPoolExecutor] = {}
_WORKERS_LOCK = threading.Lock()


def _single_threaded() -> None:
    # OpenMP/MKL thread counts are per-thread settings, but torch.set_num_threads also stores
    # the process-wide count that any thread reads on its first parallel op: every thread
    # started after it (the engine's model thread, another engine's) ran single-threaded.
    # So: this worker is made single-threaded for good here (get_num_threads initialises
    # it), and the caller restores the process-wide count after handing work out.
    torch.set_num_threads(1)
    torch.get_num_threads()


def _workers(n: int) -> ThreadPoolExecutor:
    """n threads whose torch ops run single-threaded, made once per process."""
    with _WORKERS_LOCK:
        if n not in _WORKERS:
            _WORKERS[n] = ThreadPoolExecutor(n, thread_name_prefix="bounded-attn",
                                             initializer=_single_threaded)
        return _WORKERS[n]


@torch.library.custom_op("bounded::varlen_attention", mutates_args=())
def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor,
                     prefix: Optional[Tensor] = None) -> Tensor:
    """Causal attention within each packed sequence; cu_seqlens: [S+1] host int64 offsets;
    prefix: [S] host int64, -1 or the index of an earlier sequence every token of this one
    also attends to (a query before its items; the items of one query follow it back to
    back, and their positions continue the query's).

    An opaque op for torch.export/Inductor (the graph around it is compiled; this runs the
    CPU's fastest eager kernels). CPU tensors only: on a GPU the offsets would have to be
    read back to the host in every layer, so GPU programs use `packed_attention_padded`.
    q: [T, Hq, D], k/v: [T, Hkv, D] -> [T, Hq*D]."""
    if q.device.type != "cpu" or cu_seqlens.device.type != "cpu":
        raise ValueError("bounded::varlen_attention runs on CPU tensors; use the padded attention on "
                         f"{q.device.type}")
    if q.dtype == torch.bfloat16 and q.shape[-1] % 16 == 0 and native.available():
        return torch.ops.bounded_native.varlen_attention_bf16(q, k, v, cu_seqlens, prefix)
    if q.dtype == torch.float32 and native.F32.available():
        return torch.ops.bounded_native_f32.varlen_attention_f32(q, k, v, cu_seqlens, prefix)
    offsets = cu_seqlens.tolist()
    return varlen_attention_cpu(q, k, v, list(zip(offsets[:-1], offsets[1:])),
                                None if prefix is None else prefix.tolist())


@varlen_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, prefix: Optional[Tensor] = None) -> Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
