"""The packed attention kernels against one SDPA per sequence, and their side effects on
the process: the varlen attention's single-threaded workers must not make threads started
later single-threaded too."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from engines.bounded.kernels import attention as kernels
from engines.bounded.runtime.buffers import pack


def test_varlen_workers_leave_other_threads_their_thread_count():
    before = torch.get_num_threads()
    q, k, v = torch.randn(40, 4, 8), torch.randn(40, 2, 8), torch.randn(40, 2, 8)
    spans = [(0, 20), (20, 33), (33, 40)]  # several sequences: shared out to the workers
    kernels.varlen_attention_cpu(q, k, v, spans)
    later = []
    t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    t.start()
    t.join()
    assert later == [before] and torch.get_num_threads() == before
    if before > 1:  # the workers themselves stay single-threaded
        assert set(kernels._workers(min(before, len(spans))).map(lambda _: torch.get_num_threads(), range(4))) == {1}


def test_packed_attention_kernels_agree():
    torch.manual_seed(0)
    lengths = [5, 1, 17, 9]
    t = sum(lengths)
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    b = pack([[0] * n for n in lengths])
    padded = kernels.packed_attention_padded(q, k, v, b.pad_index, b.unpad_index)
    loop = packed_attention_loop(q, k, v, list(b.spans))
    varlen = kernels.varlen_attention(q, k, v, b.cu_seqlens)
    for kind in kernels.ATTENTIONS:  # what the programs call, by kind (padded: the GPU's)
        attend = kernels.packed_attention(kind, b.cu_seqlens, b.pad_index, b.unpad_index)
        assert torch.allclose(attend(q, k, v), loop, atol=1e-5), kind
    assert torch.allclose(padded, loop, atol=1e-5)
    assert torch.allclose(varlen, loop, atol=1e-5)
    with pytest.raises(ValueError, match="choose one of per_sequence, padded"):
        kernels.packed_attention("flash", b.cu_seqlens, b.pad_index, b.unpad_index)
    # each sequence alone: attention never crosses a sequence boundary
    s, e = b.spans[2]
    alone = packed_attention_loop(q[s:e], k[s:e], v[s:e], [(0, e - s)])
    assert torch.allclose(padded[s:e], alone, atol=1e-5)


def packed_attention_loop(q, k, v, spans):
    """The reference: one causal SDPA per sequence of the packed rows, spans = [(start, end)]."""
    out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
    for start, end in spans:
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        out[start:end] = o.transpose(0, 1).reshape(end - start, -1)
    return out
