"""What the kit keeps on a device between runs (shared batches, pools: the engine's Store, STORE
here, bounded by kit.process.budget), and letting it go."""
from __future__ import annotations

import gc

import torch

from kit.engine.fixture import SharedBatches, Store
from kit.engine.pools import PoolCache
from kit.process import budget


def release() -> None:
    """Drops every batch and pool kept between runs and hands the allocator's cache back to the
    device, for the other processes on it: after the kit ran out of memory (it retries once), when
    a worker moves to another backend (whose runs use other batches), and before a pool larger
    than what is free on the device."""
    STORE.batches.clear()
    STORE.pools.clear()
    gc.collect()  # a failed run's tensors may sit in reference cycles (tracebacks)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


_last_backend = [None]


def moving_to(backend: str, device: torch.device) -> None:
    """Before a run of `backend`: a process that shares its GPU releases what it kept for the
    backend it ran before (its batches would serve that backend's runs, which other workers
    take: kit.plugin.worker_affinity). A process alone keeps them, for every backend's runs."""
    previous, _last_backend[0] = _last_backend[0], backend
    if previous is not None and previous != backend and budget.sharing(torch.device(device)) > 1:
        release()


# A worker sharing its GPU keeps unused cached blocks up to this part of its share: the blocks a
# run's peak cached go back, while the few a small run reuses stay (handing every block back after
# every run made each run allocate from the device again).
CACHED_PART = 4


def cached_unused(device: torch.device) -> int:
    """Bytes the caching allocator holds on `device` that no tensor uses."""
    return torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def after_run(device: torch.device) -> None:
    """After each run of a process that shares its GPU: what its caching allocator keeps unused
    past a part of the process's share (a run's peak) goes back to the device, for the other
    processes on it."""
    device = torch.device(device)
    if budget.gpu_shared(device) and cached_unused(device) > budget.share(device) // CACHED_PART:
        torch.cuda.empty_cache()


# What this process's runs build fixtures in (kit.harness.runner hands it to the engine).
STORE = Store(SharedBatches(), PoolCache(), kept_bytes=lambda device: budget.kept(device),
              free_bytes=lambda device: budget.free_now(device), release=lambda: release())  # looked up at each call
