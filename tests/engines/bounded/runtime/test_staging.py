"""The staging buffer: views of one planned buffer, aligned, filled per batch; on a CPU the
host and device buffers are one (nothing is copied); a batch past its capacity is refused."""
from __future__ import annotations

import pytest
import torch

from engines.bounded.runtime.staging import ALIGN, Staging, StagingFull


def test_views_are_aligned_slices_of_one_buffer_refilled_per_batch():
    st = Staging(64, torch.device("cpu"))
    assert st.shared and st.host_buffer is st.device_buffer
    st.begin()
    a = st.put([1, 2, 3])
    host, b = st.reserve(5)
    host.copy_(torch.arange(5))
    st.flush()
    assert a.tolist() == [1, 2, 3] and b.tolist() == [0, 1, 2, 3, 4]
    assert b.data_ptr() - a.data_ptr() == ALIGN * 8  # the next aligned slot, 128 bytes on
    st.begin()  # the next batch starts at the front again
    c = st.put(torch.tensor([[7, 8], [9, 10]]))
    assert c.data_ptr() == a.data_ptr() and c.tolist() == [[7, 8], [9, 10]]


def test_a_batch_past_the_capacity_is_refused():
    st = Staging(4, torch.device("cpu"))
    st.begin()
    with pytest.raises(StagingFull, match="staging buffer holds"):
        st.put(list(range(st.capacity + 1)))
