"""An xdist worker's CUDA context, begun as the worker starts. Workers making theirs at once,
after their torch import and collection, each wait several times as long as one alone, and the
last worker's first run waits for it. Made through the driver (ctypes, no torch, the GIL
released) in a thread, it overlaps the worker's imports; torch then uses the same context (the
device's primary one)."""
from __future__ import annotations

import ctypes
import threading


def _retain_primary_context(ordinal: int = 0) -> None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no NVIDIA driver: nothing to begin
        return
    device, context = ctypes.c_int(), ctypes.c_void_p()
    if cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0:
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)  # kept: torch retains it too


def begin() -> threading.Thread:
    thread = threading.Thread(target=_retain_primary_context, name="kit-cuda-context", daemon=True)
    thread.start()
    return thread
