"""Packing into the planned buffers, against hand-computed indices; batches outside the
plan refused; the export example's sizes."""
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
    assert b.cu_seqlens.device.type == "cpu"  # read on the host by the attention op
    tokens, positions, cu, last = b.varlen_args()
    assert tokens is b.tokens and cu is b.cu_seqlens and last is b.last_index


def test_batches_fill_prefixes_of_the_same_buffers():
    bufs = PackBuffers(max_tokens=10, max_seqs=3, max_len=6, device=torch.device("cpu"))
    first = bufs.pack([[1, 2, 3, 4], [5]])
    second = bufs.pack([[7], [8, 9], [1, 2, 3, 4]])
    for a, b in ((first.tokens, second.tokens), (first.positions, second.positions),
                 (first.pad_index, second.pad_index), (first.cu_seqlens, second.cu_seqlens)):
        assert a.data_ptr() == b.data_ptr()  # views of the planned buffers, nothing new
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
