"""The process's memory policy around one run: what the kit keeps between runs is released and the
run started again once where device memory ran out (kit.process.memory keeps and releases it)."""
from __future__ import annotations

from typing import Callable

import torch

from kit.harness.fault import Crash, CrowdedOut, KitOutOfMemory, in_kit_code
from kit.process import budget
from kit.process.memory import release
from kit.report.record import PASS, RunResult


def run_releasing_memory(attempt: Callable[[], None], device, result: RunResult) -> None:
    """attempt(), and where the kit runs out of device memory in its own allocations (or, on a GPU
    shared with other workers, the backend in its own), attempt() again from the start once
    everything the kit keeps is released, `result` as a fresh run's; raises KitOutOfMemory where the
    kit's allocations run out again, CrowdedOut where the backend's do while its process holds no
    more than its share of the shared GPU, the backend's crash where they do otherwise."""
    for last in (False, True):
        try:
            attempt()
            return
        except KitOutOfMemory as exc:
            oom = exc
        except Crash as exc:  # out of memory in the backend's code, while the kit held what it keeps
            if not exc.out_of_memory or not budget.gpu_shared(torch.device(device)):
                raise
            held = last and budget.crowded_out(torch.device(device))
            if held:
                raise CrowdedOut(exc, held) from exc
            oom = exc
        except RuntimeError as exc:  # torch.OutOfMemoryError of the kit's code between backend calls
            oom = in_kit_code(exc)
            if isinstance(oom, Crash):  # a fault of device work queued before, reported by the kit's next wait
                raise oom from exc
        if last:
            raise oom
        del oom  # its traceback holds the failed attempt's tensors
        release()
        result.outcome, result.failure_class, result.message = PASS, None, ""
        result.max_err = result.tol = None
        result.exec_detail, result.numerics, result.margins = "", "", []
