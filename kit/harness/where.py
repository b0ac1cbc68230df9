"""Where an error happened, as a crash message names it: the innermost frame, and where that is
inside a library the backend calls (torch, Triton) or the kit's own code that torch calls back
(the guard's dispatch of the backend's allocations), also the innermost frame of the backend's
code that called it (of the kit's, where no backend frame is on the way), which is where a
reader starts."""
from __future__ import annotations

import os
import sys
import traceback
from typing import List

import kit.harness.timeout as _timeout

# The time limit's signal handler is the frame a timeout is raised in; the line it stopped is
# the one before it.
_HANDLER = os.path.abspath(_timeout.__file__)
_LIBRARIES = ("torch", "triton")
_KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _library_dirs() -> List[str]:
    dirs = []
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(module.__file__)) + os.sep)
    return dirs


def where(exc: BaseException) -> str:
    """` at file:line`, plus ` (called from file:line)` when that line is in a library; '' if none."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) != _HANDLER]
    if not frames:
        return ""
    libraries = tuple(_library_dirs())
    in_library = lambda f: os.path.abspath(f.filename).startswith(libraries)  # noqa: E731
    in_kit = lambda f: os.path.abspath(f.filename).startswith(_KIT)  # noqa: E731
    last = frames[-1]
    text = f" at {last.filename}:{last.lineno}"
    if in_library(last) or in_kit(last):
        own = next((f for f in reversed(frames) if not in_library(f) and not in_kit(f)), None)
        if own is None and in_library(last):
            own = next((f for f in reversed(frames) if not in_library(f)), None)
        if own is not None and own is not last:
            text += f" (called from {own.filename}:{own.lineno})"
    return text
