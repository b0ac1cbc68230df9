"""Guarded allocations: while the kit watches (eager metadata and forward), every
tensor a backend allocates gets a canary tail. A write past the end of one (a
buffer sized from a stale length, an index builder running long) changes the
canary and is reported, on GPU too, where the stray write would otherwise land
silently in allocator slack.

The guard steps aside for what PyTorch runs as a whole: a higher-order operator (flex
attention's) runs without it, and torch.compile compiles as it would unwatched (with a dispatch
mode on it otherwise falls back to eager, and flex attention eager refuses modes without a rule).
What they allocate inside is theirs; the backend's own allocations around them stay guarded."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Dict, Iterator, List

import torch
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode

from kit.harness.checks import Check, Pending, read_back

GUARD_BYTES = 1024
CANARY = 0xA5
aten = torch.ops.aten
# The factories watched, by how the guarded buffer gets their values: allocated in place of the
# backend's tensor (torch.empty already applies the deterministic NaN fill), then filled.
EMPTY = {aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default}
ZEROS = {aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default}
ONES = {aten.ones.default, aten.ones_like.default, aten.new_ones.default}
FULL = {aten.full.default: 1, aten.full_like.default: 1, aten.new_full.default: 2}  # -> fill_value's position
ARANGE = {aten.arange.default, aten.arange.start, aten.arange.start_step}
FACTORIES = EMPTY | ZEROS | ONES | set(FULL) | ARANGE


@dataclasses.dataclass
class _Guarded:
    base: torch.Tensor  # the backend's tensor, then at least GUARD_BYTES of canary, in one allocation
    nbytes: int
    what: str
    canary: torch.Tensor = dataclasses.field(init=False)  # the GUARD_BYTES bytes past the tensor's end

    def __post_init__(self):
        self.canary = self.base.view(-1).view(torch.uint8)[self.nbytes:self.nbytes + GUARD_BYTES]


def _device(args, kwargs) -> torch.device:
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    if args and isinstance(args[0], torch.Tensor):  # *_like and new_*
        return args[0].device
    return torch.get_default_device()


def _fill(func, head: torch.Tensor, args, made) -> None:
    """Give the guarded tensor the values the factory would have given it (`made`: arange's
    own result)."""
    if made is not None:
        head.copy_(made)
    elif func in ZEROS:
        head.zero_()
    elif func in ONES:
        head.fill_(1)
    elif func in FULL:
        head.fill_(args[FULL[func]])


def _guarded_alloc(func, args, kwargs, where: str = ""):
    """The factory's tensor as the head of a larger allocation whose tail is the canary: one
    allocation of the tensor's size plus GUARD_BYTES, no copy (a tensor copied into a guarded
    buffer would take twice the memory). None where it cannot be guarded.
    arange runs for real and is copied in (its result is an index vector, small): on the meta
    device it goes through PyTorch's symbolic-shape checks, whose first use imports sympy, seconds
    of a worker's first run."""
    if kwargs.get("pin_memory"):
        # A page-locked host buffer (a library's staging area, e.g. FlashInfer MLA's plan workspace,
        # allocated at its first plan): the guard's own allocation would not be page-locked.
        return None
    if _device(args, kwargs).type == "meta":  # no memory to write past
        return None
    made = func(*args, **kwargs) if func in ARANGE else None
    try:
        meta = made if made is not None else func(*args, **{**kwargs, "device": torch.device("meta")})
    except (RuntimeError, TypeError, NotImplementedError):
        return None
    if not isinstance(meta, torch.Tensor) or meta.numel() == 0 or not meta.is_contiguous():
        return None
    extra = -(-GUARD_BYTES // meta.element_size())
    base = torch.empty(meta.numel() + extra, dtype=meta.dtype, device=_device(args, kwargs))
    head = base[:meta.numel()].view(meta.shape)
    _fill(func, head, args, made)
    guarded = _Guarded(base, meta.numel() * meta.element_size(),
                       f"{where}{tuple(meta.shape)} {str(meta.dtype).replace('torch.', '')}")
    guarded.canary.fill_(CANARY)
    return head, guarded


class _GuardMode(TorchDispatchMode):
    # A higher-order operator comes to __torch_dispatch__ with this mode already popped, and runs
    # there as is.
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else PyTorch wraps __torch_dispatch__ in torch._dynamo.disable, whose first call imports
        # torch._dynamo, seconds of each worker's start. The kit compiles nothing.
        return False

    def __init__(self, where: str = ""):
        super().__init__()
        self.where = where
        self.guarded: List[_Guarded] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):
            return func(*args, **kwargs)
        made = _guarded_alloc(func, args, kwargs, self.where) if func in FACTORIES else None
        if made is None:
            return func(*args, **kwargs)
        head, guarded = made
        self.guarded.append(guarded)
        return head


@dataclasses.dataclass
class GuardCheck(Check):
    # Its classes are Check's: a buffer sized from a stale length is the metadata's bug (kernel);
    # only in a replay (graph), e.g. a grid or a size from the wrong batch size.
    quiet = True
    overruns: List[str]  # "<tensor>: N of the first GUARD_BYTES bytes past its end changed"

    def describe(self) -> str:
        if self.ok:
            return "no write past a backend allocation"
        return f"wrote past the end of {len(self.overruns)} tensor(s) it allocated: {'; '.join(self.overruns[:3])}"


class Guard:
    def __init__(self, where: str = ""):
        """`where`: what the watched code is, named before each tensor it allocated (a stage the
        messages would not tell otherwise: "init_cuda_graph_state ")."""
        self._mode = _GuardMode(where)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        with self._mode:
            yield

    def check(self) -> GuardCheck:
        return read_back([canary_figures(self)])[0]


def canary_figures(*guards: Guard) -> Pending:
    """Every canary of `guards` compared at once, per device: read back with the step's other
    checks (kit.harness.checks.read_back), not one wait per guard."""
    by_device: Dict[torch.device, List[_Guarded]] = {}
    for guard in guards:
        for g in guard._mode.guarded:
            by_device.setdefault(g.base.device, []).append(g)
    groups = list(by_device.values())
    counts = tuple((torch.stack([g.canary for g in group]) != CANARY).sum(dim=1) for group in groups)

    def finish(changed: List[float]) -> GuardCheck:
        overruns = [f"{g.what}: {int(n)} of the {GUARD_BYTES} bytes past its end changed"
                    for g, n in zip([g for group in groups for g in group], changed) if n]
        return GuardCheck(not overruns, overruns)
    return Pending(counts or torch.zeros(0), finish)
