"""Packing into the planned staging buffer, against hand-computed indices; batches outside
the plan refused; the export example's sizes."""
from __future__ import annotations

import pytest
import torch

from engines.bounded.runtime.buffers import PackBuffers, example_batch, pack


def test_pack_lays_out_tokens_and_indices():
    b = pack([[5, 6, 7], [8], [9, 10]])
    assert b.tokens.tolist() == [5, 6, 7, 8, 9, 10]
    assert b.positions.tolist() == [0, 1, 2, 0, 0, 1]
    assert b.last_index.tolist() == [2, 3, 5]
    assert b.spans == ((0, 3), (3, 4), (4, 6)) and b.cu_seqlens.tolist() == [0, 3, 4, 6]
    assert b.pad_index.tolist() == [[0, 1, 2], [3, 3, 3], [4, 5, 5]]  # past the end: the last row
    assert b.unpad_index.tolist() == [0, 1, 2, 3, 6, 7]  # rows of the flattened [3 x 3] view
    assert (b.num_tokens, b.num_seqs) == (6, 3)
    assert b.cu_seqlens.device.type == "cpu"  # on a CPU: read on the host by the attention op
    tokens, positions, cu, pad, unpad, last = b.varlen_args()
    assert tokens is b.tokens and cu is b.cu_seqlens and pad is b.pad_index and last is b.last_index
    assert unpad is b.unpad_index and positions is b.positions
    assert b.prefix.tolist() == [-1, -1, -1]  # no query requests: every sequence on its own


def test_items_continue_their_query():
    # a plain sequence, then a query of 3 tokens and its two items
    b = pack([[1, 2], [5, 6, 7], [8], [9, 10]], prefix=[-1, -1, 1, 1])
    assert b.positions.tolist() == [0, 1, 0, 1, 2, 3, 3, 4]  # an item's positions follow its query's
    assert b.prefix.tolist() == [-1, -1, 1, 1] and b.last_index.tolist() == [1, 4, 5, 7]
    # the padded view's rows are the concatenations: an item's row is its query's rows, then its own
    assert b.pad_index.tolist() == [[0, 1, 1, 1, 1], [2, 3, 4, 4, 4], [2, 3, 4, 5, 5], [2, 3, 4, 6, 7]]
    assert b.unpad_index.tolist() == [0, 1, 5, 6, 7, 13, 18, 19]  # each token's row of the [4 x 5] view
    with pytest.raises(ValueError, match="an earlier sequence without a prefix"):
        pack([[1], [2], [3]], prefix=[-1, 0, 1])
    bufs = PackBuffers(max_tokens=10, max_seqs=3, max_len=4, device=torch.device("cpu"), max_positions=5)
    with pytest.raises(ValueError, match="positions up to 6 .* 5 positions"):
        bufs.pack([[1, 2, 3, 4], [5, 6]], prefix=[-1, 0])
    assert bufs.pack([[1, 2, 3, 4], [5]], prefix=[-1, 0]).positions.tolist() == [0, 1, 2, 3, 4]


def test_batches_fill_the_same_staging_buffer():
    bufs = PackBuffers(max_tokens=10, max_seqs=3, max_len=6, device=torch.device("cpu"), extra=2)
    first = bufs.pack([[1, 2, 3, 4], [5]])
    second = bufs.pack([[7], [8, 9], [1, 2, 3, 4]])
    labels = bufs.staging.put([11, 22])  # the caller's own ints ride along
    planned = bufs.staging.device_buffer
    for view in (*second.varlen_args(), labels):
        assert view.untyped_storage().data_ptr() == planned.untyped_storage().data_ptr()  # nothing new
        assert (view.data_ptr() - planned.data_ptr()) % 128 == 0  # every view starts aligned
    assert first.tokens.data_ptr() == second.tokens.data_ptr() and labels.tolist() == [11, 22]
    assert second.tokens.tolist() == [7, 8, 9, 1, 2, 3, 4] and second.positions.tolist() == [0, 0, 1, 0, 1, 2, 3]
    assert second.pad_index.tolist() == [[0, 0, 0, 0], [1, 2, 2, 2], [3, 4, 5, 6]]


@pytest.mark.parametrize("seqs", [[[1]] * 4, [[1] * 6, [1] * 5], [[1] * 7], [[1], []]])
def test_batches_outside_the_plan_are_refused(seqs):
    bufs = PackBuffers(max_tokens=10, max_seqs=3, max_len=6, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="outside the planned buffers"):
        bufs.pack(seqs)


def test_example_batch_alternates_lengths():
    b = example_batch(4, 5, torch.device("cpu"))
    assert [e - s for s, e in b.spans] == [5, 4, 5, 4] and b.num_tokens == 18 and tuple(b.pad_index.shape) == (4, 5)
