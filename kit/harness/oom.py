"""Whose out-of-memory error it is. Device memory is shared (a session's workers, other
sessions): running out of it in the kit's own allocations (batches, pools, references, copies,
graph buffers) says nothing of the backend, and is no verdict on it; running out inside the
backend's own code (its forward, metadata, hooks, its libraries) is its crash. Told apart by
where the allocation was made: the innermost frame of the traceback outside torch and the
standard library, and outside the kit's code that allocates on its caller's behalf: the guard
gives a backend's tensor its canary, the NaN fill its values (the sizes are the backend's), and a
mode's rules describe a batch for whoever asks (the kit building a batch, a backend reading its
requests' query lengths)."""
from __future__ import annotations

import sysconfig
from pathlib import Path
from types import TracebackType
from typing import List, Optional, Tuple

import torch

KIT = Path(__file__).resolve().parents[1]
ON_BEHALF = {KIT / "harness" / "guard.py", KIT / "harness" / "nan_fill.py"}
_NOT_A_CALLER = (Path(torch.__file__).resolve().parent, Path(sysconfig.get_paths()["stdlib"]).resolve(),
                 KIT / "engine" / "modes")


# Out of device memory as libraries below torch's allocator say it: Triton's launcher and the CUDA
# driver raise a RuntimeError, not torch.OutOfMemoryError.
DRIVER_OUT_OF_MEMORY = ("Triton Error [CUDA]: out of memory", "CUDA error: out of memory")


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and any(text in str(exc) for text in DRIVER_OUT_OF_MEMORY))


def _callers(tb: Optional[TracebackType]) -> List[Tuple[Path, int]]:
    """(file, line) of the frames that may have asked for the allocation that failed, innermost first."""
    frames = []
    while tb is not None:
        frames.append((Path(tb.tb_frame.f_code.co_filename).resolve(), tb.tb_lineno))
        tb = tb.tb_next
    return [(path, line) for path, line in reversed(frames)
            if path not in ON_BEHALF and not any(path.is_relative_to(d) for d in _NOT_A_CALLER)]


def allocation_site(exc: BaseException) -> str:
    callers = _callers(exc.__traceback__)
    return f"{callers[0][0]}:{callers[0][1]}" if callers else "?"


def raised_by_kit(exc: BaseException) -> bool:
    """`exc` is an out-of-memory error of an allocation the kit made for itself: the frame that
    asked is the kit's, and no backend's frame called it (a backend may call the kit's code, e.g. a
    mode's rules reading its batch: that allocation is the backend's)."""
    if not is_out_of_memory(exc):
        return False
    callers = _callers(exc.__traceback__)
    if not callers or not callers[0][0].is_relative_to(KIT):
        return False
    return all(path.is_relative_to(KIT) for path, _ in callers[1:])
