"""Fingerprints of memory the kit keeps across runs (a batch's inputs and references, the
pools' poison): a backend that writes outside its own memory (a graph replaying into
buffers freed since its capture, say) could change them, and every later run would be
judged on the change. Each holder compares its fingerprint before reuse and rebuilds."""
from __future__ import annotations

import warnings
from typing import Iterable

import torch


class KitMemoryChanged(RuntimeWarning):
    """Memory the kit keeps across runs changed between them: an earlier run of this
    process wrote outside what it was given. The kit rebuilt it; pytest lists the warning."""


def fingerprint(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The sum of each tensor's bytes, stacked (on the tensors' device): any write that
    changes a value changes it, but for changes that cancel exactly. A few reductions."""
    return torch.stack([t.reshape(-1).view(torch.uint8).sum(dtype=torch.int64) for t in tensors])


def unchanged(sealed: torch.Tensor, tensors: Iterable[torch.Tensor], what: str) -> bool:
    """Whether `tensors` still have fingerprint `sealed`; warns (KitMemoryChanged) if not."""
    now = fingerprint(tensors)
    if now.shape == sealed.shape and torch.equal(now, sealed):
        return True
    warnings.warn(KitMemoryChanged(f"{what} changed since the kit built it (an earlier run wrote outside "
                                   f"its own memory); rebuilt"), stacklevel=2)
    return False
