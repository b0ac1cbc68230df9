"""Host values onto the device without waiting for the GPU.

`torch.tensor(values, device="cuda")` and `.to("cuda")` copy, then wait for everything
queued on the stream. With several processes on one GPU each wait is a switch between
their contexts, of which a GPU makes a bounded number a second whatever the number of
processes, so these waits would bound the kit's throughput under pytest-xdist. From pageable
memory an asynchronous copy stages the values before it returns: the host tensor may go
at once, and work queued after the copy sees the values."""
from __future__ import annotations

import torch


def to_device(values, device, dtype=None) -> torch.Tensor:
    """`values` (a list or a tensor) as a tensor on `device`, of `dtype` if given. Onto the host
    it waits: an asynchronous copy from the GPU returns before the values are there."""
    given = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    return given.to(device=device, dtype=dtype, non_blocking=torch.device(device).type != "cpu")
