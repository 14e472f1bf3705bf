"""Kernels' side effects on the process: the varlen attention's single-threaded workers
must not make threads started later single-threaded too."""
from __future__ import annotations

import threading

import torch

from engines.bounded import kernels


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
