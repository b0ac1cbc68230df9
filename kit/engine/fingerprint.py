"""Fingerprints of memory the kit keeps across runs (a batch's inputs and references, the
pools' poison): a backend that writes outside its own memory (a graph replaying into
buffers freed since its capture, say) could change them, and every later run would be
judged on the change. Before a run, whatever it reuses is compared to its fingerprint, and
rebuilt where it changed (kit.engine.fixture.fixtures_for)."""
from __future__ import annotations

import warnings
from typing import Iterable, List, Sequence, Tuple

import torch


class KitMemoryChanged(RuntimeWarning):
    """Memory the kit keeps across runs changed between them: an earlier run of this
    process wrote outside what it was given. The kit rebuilt it; pytest lists the warning."""


def _word_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of the tensor's 32-bit words, wrapping (of its bytes, where they make no whole
    words), with no copy of it: bytes summed into int64 would first be copied to int64, 8 times
    the tensor, which the pools of many workers sharing a GPU do not leave room for."""
    data = t.reshape(-1).view(torch.uint8)
    start = -data.storage_offset() % 4  # the first byte of a whole word
    whole = max(0, data.numel() - start) // 4 * 4
    if not whole:  # a few bytes
        return data.to(torch.int32).sum(dtype=torch.int32)
    words = data[start:start + whole].view(torch.int32).sum(dtype=torch.int32)
    if start == 0 and whole == data.numel():
        return words
    return words + torch.cat([data[:start], data[start + whole:]]).to(torch.int32).sum(dtype=torch.int32)


def fingerprint(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """Each tensor's word sum, stacked (on the tensors' device): any write that changes a value
    changes it, but for changes that cancel exactly. A reduction per tensor."""
    return torch.stack([_word_sum(t) for t in tensors])


def unchanged(kept: Sequence[Tuple[torch.Tensor, Sequence[torch.Tensor], str]]) -> List[bool]:
    """For each (sealed, tensors, what): whether `tensors` still have fingerprint `sealed`,
    read back at once (each wait is a switch between contexts when processes share a GPU);
    warns (KitMemoryChanged) for each that changed."""
    if not kept:
        return []
    flags = []
    for sealed, tensors, _ in kept:
        now = fingerprint(tensors)
        flags.append((now == sealed).all() if now.shape == sealed.shape else torch.zeros((), dtype=torch.bool))
    same = [bool(x) for x in torch.stack([f.to(kept[0][0].device) for f in flags]).tolist()]
    for (_, _, what), ok in zip(kept, same):
        if not ok:
            warnings.warn(KitMemoryChanged(f"{what} changed since the kit built it (an earlier run wrote outside "
                                           f"its own memory); rebuilt"), stacklevel=3)
    return same
