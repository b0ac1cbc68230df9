"""Triton's interpreter (TRITON_INTERPRET=1, the CPU runs) without its repeated set-up.

A kernel launch patches `triton.language` for the interpreter (`_patch_lang`) and puts it
back when the grid is done. Every call of a @triton.jit helper inside the kernel patches it
again, for every program of the grid, though nothing changes: the launch's patches are in
place until its end, and the helper's own are never put back. With helpers in a kernel's
inner loop that was 40% of a run's time. `install()` makes a helper's call skip it when the
kernel's launch has already patched the language modules the helper sees; any other call
patches as before. The kernels compute the same; only the redundant patching is gone.
"""
from __future__ import annotations

import inspect
import sys
from typing import FrozenSet, List, Set

_launches: List[FrozenSet[int]] = []  # the language modules each unfinished launch patched (ids)
# Modules a helper's call patched: Triton never puts these back, and a later launch's restore
# puts back what it found, patched. (Class attributes a helper's call patches, of tl.tensor
# say, are put back by the launch's restore; every launch patches them again.)
_kept: Set[int] = set()


class _NothingToRestore:
    def restore(self) -> None:
        pass


def _langs(fn, tl) -> FrozenSet[int]:
    """The language modules `_patch_lang(fn)` patches: the ones fn's globals name (as Triton finds them)."""
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def _patch_once(patch_lang, tl):
    def patch(fn):
        langs = _langs(fn, tl)
        if _launches:  # a helper's call inside a launch
            if langs and langs <= _launches[-1] | _kept:
                return _NothingToRestore()
            scope = patch_lang(fn)  # patched as before, and never put back (Triton drops the scope)
            _kept.update(langs)
            return scope
        scope = patch_lang(fn)
        _launches.append(langs)
        restore = scope.restore

        def restore_and_end():
            _launches.pop()
            restore()
        scope.restore = restore_and_end
        return scope
    patch.__wrapped__ = patch_lang
    return patch


def install() -> bool:
    """Once per process, when Triton's interpreter is loaded and shaped as this expects
    (a module-level `_patch_lang(fn)` returning a scope with `restore()`); True if in place."""
    interp = sys.modules.get("triton.runtime.interpreter")
    original = getattr(interp, "_patch_lang", None)
    if original is None:
        return False
    if hasattr(original, "__wrapped__"):
        return True  # installed
    import triton.language as tl
    interp._patch_lang = _patch_once(original, tl)
    return True
