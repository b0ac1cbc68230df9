"""Guarded allocations: while the kit watches (eager metadata and forward), every
tensor a backend allocates gets a canary tail. A write past the end of one (a
buffer sized from a stale length, an index builder running long) changes the
canary and is reported, on GPU too, where the stray write would otherwise land
silently in allocator slack."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import ClassVar, Iterator, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kit.record import GRAPH, KERNEL

GUARD_BYTES = 1024
CANARY = 0xA5
aten = torch.ops.aten
FACTORIES = {
    aten.empty.memory_format, aten.zeros.default, aten.ones.default, aten.full.default, aten.arange.default,
    aten.arange.start, aten.arange.start_step, aten.empty_like.default, aten.zeros_like.default,
    aten.ones_like.default, aten.full_like.default, aten.new_empty.default, aten.new_zeros.default,
    aten.new_ones.default, aten.new_full.default,
}


@dataclasses.dataclass
class _Guarded:
    base: torch.Tensor  # uint8: the tensor's bytes, then GUARD_BYTES of canary
    nbytes: int
    what: str


class _GuardMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.guarded: List[_Guarded] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func not in FACTORIES or not isinstance(out, torch.Tensor) or out.numel() == 0 or not out.is_contiguous():
            return out
        nbytes = out.numel() * out.element_size()
        base = torch.empty(nbytes + GUARD_BYTES, dtype=torch.uint8, device=out.device)
        base[nbytes:].fill_(CANARY)
        guarded = base[:nbytes].view(out.dtype).view(out.shape)
        guarded.copy_(out)
        self.guarded.append(_Guarded(base, nbytes, f"{tuple(out.shape)} {str(out.dtype).replace('torch.', '')}"))
        return guarded


@dataclasses.dataclass
class GuardCheck:
    failure_class: ClassVar[str] = KERNEL  # a buffer sized from a stale length: the metadata's bug
    graph_class: ClassVar[str] = GRAPH  # only in a replay: e.g. a grid or size from the wrong batch size
    quiet: ClassVar[bool] = True
    replay_only: ClassVar[bool] = False
    ok: bool
    overruns: List[str]  # "<tensor>: N of the first GUARD_BYTES bytes past its end changed"

    @classmethod
    def merged(cls, *checks: "GuardCheck") -> "GuardCheck":
        overruns = [o for c in checks for o in c.overruns]
        return cls(not overruns, overruns)

    def describe(self) -> str:
        if self.ok:
            return "no write past a backend allocation"
        return f"wrote past the end of {len(self.overruns)} tensor(s) it allocated: {'; '.join(self.overruns[:3])}"


class Guard:
    def __init__(self):
        self._mode = _GuardMode()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        with self._mode:
            yield

    def check(self) -> GuardCheck:
        overruns = []
        for g in self._mode.guarded:
            changed = int((g.base[g.nbytes:] != CANARY).sum())
            if changed:
                overruns.append(f"{g.what}: {changed} of the {GUARD_BYTES} bytes past its end changed")
        return GuardCheck(not overruns, overruns)
