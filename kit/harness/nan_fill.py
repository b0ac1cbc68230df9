"""Outputs are pre-filled with NaN so rows a backend never writes fail the verdict.

Backends allocate their own output (torch.empty and friends); PyTorch's
fill_uninitialized_memory fills every such allocation with NaN while
deterministic mode is on. Inside a CUDA graph the fill is captured too, so each
replay starts from NaN as well.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

# The flag itself: torch.use_deterministic_algorithms also sets torch.compile's copy of it, and
# importing that config imports torch._dynamo, seconds of each worker's start.
_set_deterministic = getattr(torch._C, "_set_deterministic_algorithms", torch.use_deterministic_algorithms)


@contextlib.contextmanager
def nan_filled_allocations():
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    _set_deterministic(True, warn_only=True)  # warn_only: never change what runs
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
        _set_deterministic(was_on, warn_only=was_warn_only)
