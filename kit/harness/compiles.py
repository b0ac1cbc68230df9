"""Compiles counted and timed where each library begins one (kit.spend): Triton's compilation
listener (told whether the kernel came from its on-disk cache), torch.compile's start and end
callbacks and inductor's FX-graph cache counters (a miss or a bypass is a compile), FlashInfer's
JIT build (a compile where its library is new or rebuilt). A cache hit counts nothing: a run
whose kernels all came from the caches counts none. Hooks go on the libraries already imported,
never importing one: `watch()` is called before and after each run and once its backend loads."""
from __future__ import annotations

import contextlib
import functools
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator

from kit import spend

_hooked: Dict[str, bool] = {}


def _triton() -> None:
    from triton import knobs

    chained = knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        if not cache_hit:
            spend.counted(spend.TRITON)
            spend.moved(spend.TRITON, times.total / 1e6)  # microseconds
        if chained is not None:
            chained(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)
    knobs.compilation.listener = listener


def _inductor() -> None:
    from torch._dynamo.callback import callback_handler

    open_ = []

    def start(args) -> None:
        open_.append(spend.timed(spend.INDUCTOR))
        open_[-1].__enter__()

    def end(args) -> None:
        if open_:
            open_.pop().__exit__(None, None, None)
    callback_handler.register_start_callback(start)
    callback_handler.register_end_callback(end)


_inductor_seen = [0]  # its FX-graph cache's misses and bypasses counted so far


def _inductor_misses() -> None:
    """Counted from inductor's own counters, which start at its import: a compile in the run that
    first imported it counts too, though its timing callbacks were not yet on."""
    counters = sys.modules["torch._dynamo.utils"].counters["inductor"]
    total = counters["fxgraph_cache_miss"] + counters["fxgraph_cache_bypass"]
    spend.counted(spend.INDUCTOR, total - _inductor_seen[0])
    _inductor_seen[0] = total


def _flashinfer() -> None:
    from flashinfer.jit.core import JitSpecNvcc

    build = JitSpecNvcc.build

    @functools.wraps(build)
    def counted_build(self, *args, **kwargs):
        before = _mtime(self.jit_library_path)
        start = time.perf_counter()
        try:
            return build(self, *args, **kwargs)
        finally:
            if _mtime(self.jit_library_path) != before:  # ninja built it: not up to date, or not there
                spend.counted(spend.FLASHINFER)
                spend.moved(spend.FLASHINFER, time.perf_counter() - start)
    JitSpecNvcc.build = counted_build


def _mtime(path: Path):
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


# The module whose import means the library is there to hook, and how.
HOOKS: Dict[str, Callable[[], None]] = {"triton.knobs": _triton, "torch._dynamo": _inductor,
                                        "flashinfer.jit.core": _flashinfer}


def watch() -> None:
    """Hooks on every library imported so far, once each; inductor's compiles since the last call
    counted."""
    for module, hook in HOOKS.items():
        if module in sys.modules and not _hooked.get(module):
            _hooked[module] = True
            hook()
    if "torch._dynamo.utils" in sys.modules:
        _inductor_misses()


def as_a_new_process() -> None:
    """torch.compile's in-memory state (dynamo's compiled code, guards and recompiles) cleared as a new
    process has it, the on-disk caches kept: an engine's worker serves one model, so a run compiles as
    that worker would, never on top of the shapes of the runs before it in this process (SGLang's flex
    EXTEND lowered or failed to lower by what the process had compiled before it)."""
    if "torch._dynamo" not in sys.modules:
        return
    import torch._dynamo

    torch._dynamo.reset()
    _hooked.pop("torch._dynamo", None)  # reset() drops the timing callbacks: the next watch() puts them back


class CompiledInCapture(RuntimeError):
    """torch.compile compiled inside a graph's capture."""


_begun = [0]  # torch.compile's compiles begun while _count_begun was registered


def _count_begun(args) -> None:
    _begun[0] += 1


def _compiles_begun() -> int:
    """torch.compile's compiles begun so far, counted from dynamo's start callback (registered here
    where missing: torch._dynamo.reset() drops callbacks); 0 where dynamo is not imported."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.callback import callback_handler

    if _count_begun not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_count_begun)
    return _begun[0]


@contextlib.contextmanager
def none_inside(what: str) -> Iterator[None]:
    """Raises CompiledInCapture where torch.compile compiled in the block (`what`: the capture), the
    block's own error chained: a compile cannot be captured (inductor copies from the host, tunes,
    synchronizes), and an engine's runner compiles at its warm-ups, never in a capture."""
    before = _compiles_begun()
    failed = None
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - re-raised below, or named as what a compile in it caused
        failed = exc
    compiled = _compiles_begun() - before
    if compiled:
        raise CompiledInCapture(f"torch.compile compiled {compiled} function(s) inside {what}, which a graph "
                                f"cannot hold: the warm-up runs before it must call the backend exactly as the "
                                f"capture does") from failed
    if failed is not None:
        raise failed
