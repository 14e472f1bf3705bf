"""Host-built int64 metadata on its way to the device: one planned host buffer (pinned, on a
GPU) and its device twin, filled per batch and copied without blocking the host.

A batch's metadata (packed tokens, positions, padded-view indices, beam choice indices) is
built on the host once per batch, written into consecutive slices of the host buffer, and
each slice goes to the same slice of the device buffer with a non-blocking copy, ordered
before the kernels that read it on the stream. On a CPU the two buffers are one: nothing is
copied. The host buffer is reused by the next batch only after that batch's `begin` has
waited for the last copy out of it (long done by then: the previous batch's result was read).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor


class StagingFull(ValueError):
    pass


ALIGN = 16  # slots (128 bytes): every view starts aligned, as compiled kernels may assume


class Staging:
    def __init__(self, capacity: int, device: torch.device):
        self.device = torch.device(device)
        self.capacity = capacity + ALIGN * 8  # room for the alignment gaps of a few views
        self.device_buffer = torch.zeros(self.capacity, dtype=torch.int64, device=self.device)
        self.shared = self.device.type == "cpu"
        self.host_buffer = self.device_buffer if self.shared else \
            torch.zeros(self.capacity, dtype=torch.int64, pin_memory=True)
        self._used = self._sent = 0
        self._copied: Optional["torch.cuda.Event"] = None

    def begin(self) -> None:
        """Start a batch: the host buffer is free again once the last copy out of it is done."""
        if self._copied is not None:
            if not self._copied.query():  # (query does not wait; the copy is almost always done)
                self._copied.synchronize()
            self._copied = None
        self._used = self._sent = 0

    def reserve(self, n: int) -> tuple[Tensor, Tensor]:
        """The next n slots: (host view to fill, device view the kernels may read after `flush`)."""
        a = -(-self._used // ALIGN) * ALIGN
        b = a + n
        if b > self.capacity:
            raise StagingFull(f"batch metadata needs {b} slots, the staging buffer holds {self.capacity}")
        self._used = b
        return self.host_buffer[a:b], self.device_buffer[a:b]

    def flush(self) -> None:
        """Send what was reserved since the last flush to the device: one non-blocking copy from
        pinned memory, ordered before the kernels that read it (nothing to do on a CPU)."""
        a, b = self._sent, self._used
        self._sent = b
        if self.shared or a == b:
            return
        self.device_buffer[a:b].copy_(self.host_buffer[a:b], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record(torch.cuda.current_stream(self.device))

    def put(self, values: Sequence[int] | Tensor) -> Tensor:
        """values (host ints) -> a device view holding them (sent at once)."""
        values = torch.as_tensor(values, dtype=torch.int64)
        host, device = self.reserve(values.numel())
        host.copy_(values.reshape(-1))
        self.flush()
        return device.view(values.shape)
