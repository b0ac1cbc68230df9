"""Where a process's time goes: seconds per category, each exclusive of the categories timed inside
it (a compile inside a backend's call is the compile's, not the kernel's), and counts of events
(compiles, by library). Process-wide totals that only grow; a reader takes a `snapshot()` before
and `since()` after what it measures. Free of torch and of the rest of the kit: the engine (the
reference), the harness (backend calls, kit.harness.compiles) and the plugins all charge here."""
from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Dict, Iterator, List

# Categories of seconds.
REFERENCE = "reference"  # the float64 and same-dtype references (kit.engine.reference)
KERNEL = "kernel"  # the backend's calls and the wait for the device work they queued
LOAD = "load"  # loading a backend (its first run in a process imports it)
# Compiles, by library: seconds and counts. A cache hit (a kernel loaded from disk) is none.
TRITON, INDUCTOR, FLASHINFER = "compile.triton", "compile.inductor", "compile.flashinfer"
COMPILERS = (TRITON, INDUCTOR, FLASHINFER)

_seconds: "collections.Counter[str]" = collections.Counter()
_counts: "collections.Counter[str]" = collections.Counter()
_local = threading.local()  # per thread, the timers open: [category, when its clock last started]


def _open() -> List[list]:
    if not hasattr(_local, "open"):
        _local.open = []
    return _local.open


@contextlib.contextmanager
def timed(category: str) -> Iterator[None]:
    """The block's seconds to `category`, less those of the timers opened inside it."""
    stack, now = _open(), time.perf_counter()
    if stack:  # the enclosing timer's clock stops while this one runs
        _seconds[stack[-1][0]] += now - stack[-1][1]
    entry = [category, now]
    stack.append(entry)
    try:
        yield
    finally:
        now = time.perf_counter()
        if entry in stack:
            while stack and stack[-1] is not entry:  # timers left open by a callback that never ended
                stack.pop()
            _seconds[category] += now - entry[1]
            stack.pop()
        if stack:
            stack[-1][1] = now


def moved(category: str, seconds: float) -> None:
    """`seconds` already spent inside the open timer (a compile reported once it ended) to `category`,
    taken from that timer's."""
    _seconds[category] += seconds
    stack = _open()
    if stack:
        stack[-1][1] += seconds


def counted(category: str, n: int = 1) -> None:
    _counts[category] += n


def snapshot() -> Dict[str, Dict[str, float]]:
    """The totals so far (timers still open charge what they have run when they close)."""
    return dict(seconds=dict(_seconds), counts=dict(_counts))


def since(before: Dict[str, Dict[str, float]]) -> Dict[str, Dict[str, float]]:
    """What was charged since `before` (a snapshot): the categories that grew."""
    now = snapshot()
    return {kind: {k: round(v - before[kind].get(k, 0), 6) for k, v in now[kind].items()
                   if v != before[kind].get(k, 0)} for kind in now}


def compiles(spent: Dict[str, Dict[str, float]]) -> int:
    """The compiles in `spent` (since()), every library's."""
    return int(sum(spent["counts"].get(c, 0) for c in COMPILERS))
