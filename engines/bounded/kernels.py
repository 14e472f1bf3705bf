"""Tensor kernels of the bounded engine: norms, rotary embedding, packed attention, GEMMs.

Pure functions over tensors (no modules, no request logic), written so that both eager
mode and torch.export/Inductor handle them. Shapes: T packed tokens, S sequences, L the
longest sequence of a batch, H heads, D head dim.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # x: [..., D] (any float dtype); statistics in float32 like the HF reference, result in
    # weight.dtype (the GEMM dtype: a float32 residual stream is cast here)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(weight.dtype)


def rope_inv_freq(head_dim: int, theta: float) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def rope_tables(inv_freq: Tensor, max_positions: int) -> tuple[Tensor, Tensor]:
    # -> cos, sin: [max_positions, D] float32 (angles as in the HF reference: pos * inv_freq)
    pos = torch.arange(max_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [T, H, D]; cos/sin: [T, D] already in x.dtype
    cos, sin = cos[:, None, :], sin[:, None, :]
    return x * cos + rotate_half(x) * sin


def swiglu(gate_up: Tensor) -> Tensor:
    # gate_up: [T, 2I] (gate rows first, as fused at load) -> [T, I]
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def dense_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    # x: [T, K] 2-D contiguous (a strided 3-D input makes F.linear copy the weight per call)
    return F.linear(x, weight, bias)


def fp8_quantise(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-tensor float8_e4m3fn weight and its float32 scale, for `fp8_linear`."""
    fmax = torch.finfo(torch.float8_e4m3fn).max
    scale = weight.abs().amax().float().clamp(min=1e-12) / fmax
    return (weight.float() / scale).to(torch.float8_e4m3fn), scale


def fp8_linear(x: Tensor, weight_fp8: Tensor, weight_scale: Tensor,
               bias: Optional[Tensor] = None) -> Tensor:
    # x: [T, K]; weight_fp8: [N, K]; dynamic per-tensor activation scale
    fmax = torch.finfo(torch.float8_e4m3fn).max
    x_scale = x.abs().amax().float().clamp(min=1e-12) / fmax
    x8 = (x.float() / x_scale).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, weight_fp8.t(), scale_a=x_scale, scale_b=weight_scale,
                            bias=bias, out_dtype=x.dtype)


# --- attention -------------------------------------------------------------------------

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


def packed_attention_padded(q: Tensor, k: Tensor, v: Tensor, pad_index: Tensor,
                            unpad_index: Tensor) -> Tensor:
    """Causal attention within each packed sequence, as one batched SDPA over a padded view.

    q: [T, Hq, D], k/v: [T, Hkv, D]; pad_index: [S, L] packed row of (sequence, position),
    positions past a sequence's end point at any of its rows; unpad_index: [T] row of the
    flattened [S*L] padded output for each packed token. Causality keeps every real query
    away from the padding keys, so no mask is needed. Returns [T, Hq*D].
    """
    s, l = pad_index.shape
    qp = q[pad_index].transpose(1, 2)  # [S, Hq, L, D]
    kp = k[pad_index].transpose(1, 2)  # [S, Hkv, L, D]
    vp = v[pad_index].transpose(1, 2)
    o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
    o = o.transpose(1, 2).reshape(s * l, -1)  # [S*L, Hq*D]
    return o[unpad_index]


def varlen_attention_cpu(q: Tensor, k: Tensor, v: Tensor, spans: list[tuple[int, int]],
                         fp32_scores: bool = True) -> Tensor:
    """Causal attention of each packed sequence, per sequence with two batched GEMMs.

    The g query heads sharing a kv head are stacked into one [g*n, D] matrix (no K/V
    repeat); the causal mask is an additive bias, softmax in float32. On CPUs without AMX
    this runs ~2.5x faster than the flash kernel over a padded view, and with no padding.
    `fp32_scores` computes Q K^T from float32 copies (bf16 GEMM output would round the
    logits). The sequences are shared out to one single-threaded worker per intra-op
    thread: the per-sequence ops are too small to split well across OpenMP threads, and a
    spinning OpenMP team stalls badly when another process holds a core.
    q: [T, Hq, D], k/v: [T, Hkv, D] -> [T, Hq*D].
    """
    t, hq, d = q.shape
    out = torch.empty(t, k.shape[1], hq // k.shape[1], d, dtype=q.dtype, device=q.device)
    longest = max(e - s for s, e in spans)
    bias = torch.full((longest, longest), float("-inf"), device=q.device).triu_(1)
    groups = _balance(spans, torch.get_num_threads())
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def run(group: list[tuple[int, int]]) -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):  # thread-local modes
            for start, end in group:
                out[start:end] = _attend_one(q[start:end], k[start:end], v[start:end], bias, fp32_scores)

    if len(groups) == 1:
        run(groups[0])
    else:
        threads = torch.get_num_threads()
        list(_workers(len(groups)).map(run, groups))
        torch.set_num_threads(threads)  # see _single_threaded
    return out.view(t, hq * d)


def _attend_one(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, fp32_scores: bool) -> Tensor:
    # one sequence: q [n, Hq, D], k/v [n, Hkv, D] -> [n, Hkv, g, D]
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qs = q.reshape(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
    ks, vs = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, n, D]
    if fp32_scores:
        qs, ks = qs.float(), ks.float()
    scores = torch.matmul(qs, ks.transpose(1, 2)).view(hkv, g, n, n)
    scores = torch.add(bias[:n, :n], scores, alpha=d ** -0.5)  # float32
    p = torch.softmax(scores, dim=-1).to(v.dtype).view(hkv, g * n, n)
    return torch.matmul(p, vs).view(hkv, g, n, d).permute(2, 0, 1, 3)


def _balance(spans: list[tuple[int, int]], parts: int) -> list[list[tuple[int, int]]]:
    """Longest-first assignment of sequences to `parts` groups by attention work (n^2)."""
    parts = max(1, min(parts, len(spans)))
    groups: list[list[tuple[int, int]]] = [[] for _ in range(parts)]
    load = [0] * parts
    for span in sorted(spans, key=lambda s: s[0] - s[1]):
        i = load.index(min(load))
        groups[i].append(span)
        load[i] += (span[1] - span[0]) ** 2
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
def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Causal attention within each packed sequence; cu_seqlens: [S+1] host int64 offsets.

    An opaque op for torch.export/Inductor (the graph around it is compiled; this runs the
    device's fastest eager kernels). q: [T, Hq, D], k/v: [T, Hkv, D] -> [T, Hq*D]."""
    offsets = cu_seqlens.tolist()
    if q.device.type == "cpu":
        return varlen_attention_cpu(q, k, v, list(zip(offsets[:-1], offsets[1:])))
    return varlen_attention_padded(q, k, v, cu_seqlens)


def varlen_attention_padded(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> Tensor:
    """The GPU path: one flash SDPA over the padded view (a per-sequence loop would launch
    layers x sequences small kernels). cu_seqlens: [S+1] host offsets."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]  # [S]
    longest = int(lengths.max())
    cols = torch.arange(longest)[None, :]
    pad_index = cu_seqlens[:-1, None] + torch.minimum(cols, lengths[:, None] - 1)  # [S, L]
    seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # [T]
    unpad_index = seq * longest + torch.arange(int(cu_seqlens[-1])) - cu_seqlens[:-1][seq]
    return packed_attention_padded(q, k, v, pad_index.to(q.device), unpad_index.to(q.device))


@varlen_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def packed_attention_loop(q: Tensor, k: Tensor, v: Tensor, spans: list[tuple[int, int]]) -> Tensor:
    """Same result as `packed_attention_padded`, one SDPA per sequence (eager only: the
    Python loop over `spans` = [(start, end)] is request-dependent)."""
    out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
    for start, end in spans:
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        out[start:end] = o.transpose(0, 1).reshape(end - start, -1)
    return out
