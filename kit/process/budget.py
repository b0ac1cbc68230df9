"""How much device memory this process may keep between runs. Its share of a GPU is what was
free on the GPU when the process first asked (other sessions' memory is not free) divided by the
session's processes on that GPU (kit.process.placement); on CPU 1 GiB split between the workers.
A process alone on a GPU keeps batches for every backend up to a quarter of its share; processes
that share one keep none past the last few (kept tensors pin the caching allocator's segments they
were cut from, and workers sharing a GPU would run it out of memory; a worker runs few of the
other backends' runs of a batch), and let go of what they keep when they move to
another backend (kit.process.memory). Before a large allocation (a pool) the kit checks what is
free now. A process that shares its GPU hands its allocator's unused cache back after a run that left more
than a quarter of its share cached (kit.process.memory.after_run): what one worker cached at its
peak never runs another out of memory."""
from __future__ import annotations

import functools

import torch

from kit.process import placement

CPU_BYTES = 1 << 30


def sharing(device: torch.device) -> int:
    """The session's processes on this process's GPU (itself included): its workers are spread
    over the GPUs (kit.process.placement)."""
    index, count = placement.my_gpu() if device.type == "cuda" else (0, 1)
    return placement.workers_on(index, placement.worker_count(), count)


def gpu_shared(device: torch.device) -> bool:
    """This process runs on a GPU with other processes of the session."""
    return device.type == "cuda" and sharing(device) > 1


@functools.lru_cache(maxsize=None)
def _free_at_start(device: str) -> int:
    return torch.cuda.mem_get_info(torch.device(device))[0]


def share(device: torch.device) -> int:
    """Bytes of `device` this process may use."""
    if device.type != "cuda":
        return CPU_BYTES // placement.worker_count()
    return _free_at_start(str(device)) // sharing(device)


def kept(device: torch.device) -> int:
    """Bytes of batches kept between runs for every backend (kit.engine.fixture)."""
    if device.type != "cuda":
        return share(device)
    return share(device) // 4 if sharing(device) == 1 else 0


def free_now(device: torch.device) -> int:
    """Bytes free on `device` now (a driver query, no wait for the device); CPU: unbounded."""
    if device.type != "cuda":
        return 1 << 62
    return torch.cuda.mem_get_info(device)[0]


def crowded_out(device: torch.device) -> str:
    """Where this process ran out of memory on a GPU it shares while holding no more than its
    share, what says so (its neighbours held the rest); "" where it held more (its own appetite)."""
    if device.type != "cuda":
        return ""
    held = torch.cuda.memory_reserved(device)
    if held > share(device):
        return ""
    return (f"this process held {held / 2 ** 30:.1f} GiB, within its share of {share(device) / 2 ** 30:.1f} GiB, "
            f"and the device had {free_now(device) >> 20} MiB free")
