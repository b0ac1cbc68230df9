"""The Triton interpreter's numpy warnings on masked lanes, which are noise, kept out of runs.

On CPU (TRITON_INTERPRET=1) the interpreter computes every lane of a block with numpy, the
masked ones too: a lane past a sequence's end holds -inf or garbage (a score row of -inf minus
its -inf maximum is NaN), which the kernel then drops with `tl.where` or a masked store, as a
GPU computes and drops it silently. numpy warns about it ("invalid value encountered in
subtract", overflow in exp) once per call site. The kit judges the outputs, so these say
nothing; only they are filtered (that category, from the interpreter's module, those
messages), inside a run.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

_MODULE = r"triton\.runtime\.interpreter"
_MESSAGE = r"(invalid value|overflow|divide by zero) encountered in "


@contextlib.contextmanager
def interpreter_noise_filtered() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_MESSAGE, category=RuntimeWarning, module=_MODULE)
        yield
