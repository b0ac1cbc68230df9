"""An xdist worker's process: its share of the cores, its CUDA state made before its first run,
and its end without the interpreter's teardown."""
from __future__ import annotations

import atexit
import os
import sys

import pytest

from kit.process.placement import threads_per_worker
from kit.plugin.selection import run_of


def split_threads(config) -> None:
    """Under xdist, each worker gets its share of the cores for torch's CPU work. Left at
    torch's default, N workers run N threads per core, and idle threads spin. An
    OMP_NUM_THREADS the user set is left as it is."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "OMP_NUM_THREADS" not in os.environ:
        import torch
        torch.set_num_threads(threads_per_worker(torch.get_num_threads(), int(workerinput["workercount"])))


def exit_without_teardown(config) -> None:
    """An xdist worker ends as soon as its session has: after pytest's unconfigure and cleanups it
    runs its exit handlers (atexit's os._exit, registered first, runs last) and exits, skipping the
    interpreter's teardown of torch, Triton and FlashInfer. Its results were sent before (xdist's
    workerfinished, at sessionfinish). Left to xdist, every worker waits for the controller to end
    it after the last run anywhere, and all of them then free their CUDA contexts at once, which
    the controller waits for."""
    if hasattr(config, "workerinput"):
        atexit.register(os._exit, 0)
        config.add_cleanup(_run_exit_handlers)  # registered early: the cleanups run last to first


def _run_exit_handlers() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()  # CPython's own at-exit step, which ends here with the os._exit above


class DeviceSetup:
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session):
        """An xdist worker sets up torch's CUDA state (on the context kit.plugin.cuda_context began)
        before its first run rather than in it, where the run's time would count it."""
        if hasattr(session.config, "workerinput") and any(run_of(item.nodeid) for item in session.items):
            from kit.harness.runner import make_device_context
            make_device_context()
