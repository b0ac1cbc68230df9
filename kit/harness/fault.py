"""Whose fault a run's failure is: the backend's (a crash, in the stage it happened), the kit's own
(out of memory in its allocations: no verdict), or the device's (a sticky fault: every later call
in the process fails too, so the run that caused it owns it). Every backend call goes through
`call` or `unsynced`, every verdict through `judged_on_device`; `charged` turns what a run raised
into its record."""
from __future__ import annotations

from typing import Optional

import torch

from kit import spend
from kit.harness.oom import allocation_site, is_out_of_memory, raised_by_kit
from kit.harness.timeout import RunTimeout
from kit.harness.where import where
from kit.report.record import CRASH, ENVIRONMENT, ERROR, FAIL, PASS, RunResult

# CUDA errors after which the context is unusable: every later call in the process fails too.
STICKY_DEVICE_ERRORS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                        "misaligned address", "illegal instruction", "an illegal address")


def sticky(exc: BaseException) -> bool:
    return any(e in str(exc) for e in STICKY_DEVICE_ERRORS)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


def timed_out(exc: BaseException) -> bool:
    """The run's time limit, raised as it is or wrapped: Triton's interpreter raises every error of a
    kernel as an InterpreterError caused by it."""
    while exc is not None:
        if isinstance(exc, RunTimeout):
            return True
        exc = exc.__cause__
    return False


def raised(exc: BaseException) -> str:
    """What a backend raised, as a crash message names it: its type, its text and where (kit.harness.where)."""
    return f"{type(exc).__name__}: {exc}{where(exc)}"


class Crash(Exception):
    """A backend raised (or the device faulted); carries where it happened."""

    def __init__(self, stage: str, exc: BaseException):
        self.device_lost = sticky(exc)
        self.timed_out = timed_out(exc)
        self.out_of_memory = is_out_of_memory(exc)
        super().__init__(f"{stage}: {raised(exc)}")


class KitOutOfMemory(Exception):
    """The kit ran out of device memory in its own allocations (kit.harness.oom): no verdict."""

    why = "out of device memory in the kit's own allocations"

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{stage}: {type(exc).__name__}: {_first_line(exc)} (allocated at {allocation_site(exc)})")


class CrowdedOut(KitOutOfMemory):
    """The backend ran out of device memory on a GPU other processes of the session share, again
    after the retry, while its process held no more than its share: the memory was theirs, no verdict."""

    def __init__(self, crash: "Crash", held: str):
        Exception.__init__(self, str(crash))
        self.why = f"out of device memory on a GPU the session's processes share ({held}: the others held the rest)"


# Stages that load and ask the backend, rather than run its kernels (kit.spend.LOAD).
LOADING = ("loading backend", "versions()", "supports()")


def unsynced(stage: str, fn, *args, **kwargs):
    """fn(...), whatever it raises the backend's crash in `stage`, or the kit's out of memory."""
    try:
        with spend.timed(spend.LOAD if stage in LOADING else spend.KERNEL):
            return fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise  # the user stops the session (what finished is kept)
    except BaseException as exc:  # noqa: BLE001 - every backend error is a verdict: sys.exit and timeouts too
        raise (KitOutOfMemory if raised_by_kit(exc) else Crash)(stage, exc) from exc


def call(stage: str, fn, *args, **kwargs):
    """fn, then a wait for the device: its faults surface in this stage, not in the next case."""
    result = unsynced(stage, fn, *args, **kwargs)
    unsynced(stage, device_done)
    return result


def judged_on_device(stage: str, judge):
    """`judge()`, whose first read back is the first wait for the device after the backend's
    kernels (no wait of their own: each is a switch between contexts when workers share the
    GPU). A device fault those kernels caused surfaces in it, and is the backend's, in `stage`;
    the kit's own errors stay the kit's."""
    try:
        return judge()
    except RuntimeError as exc:
        if sticky(exc):
            raise Crash(stage, exc) from exc
        raise


def in_kit_code(exc: RuntimeError) -> Exception:
    """What a RuntimeError the kit's own code raised between backend calls is: a device fault of
    work queued before (the backend's crash), the kit's out of memory; else it is re-raised."""
    if sticky(exc):
        return Crash("the device faulted (seen in the kit's own code)", exc)
    if raised_by_kit(exc):
        return KitOutOfMemory("the kit, between backend calls", exc)
    raise exc


def device_done() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _late_device_fault() -> Optional[str]:
    """A sticky fault of device work the run launched and nothing waited for: a failed run's
    (it ended in an exception first), or work on another stream than the one the judge read
    back. Reported by the next wait, it is this run's, not the next one's."""
    try:
        device_done()
    except RuntimeError as exc:
        if sticky(exc):
            return _first_line(exc)
        raise
    return None


def charge_late_fault(result: RunResult) -> None:
    fault = _late_device_fault()
    if fault is None:
        return
    if result.outcome == PASS:  # the judge's read back waited for one stream; the fault was on another
        result.message = f"every check passed, then the device reported: {fault}"
    else:
        result.message = f"{result.message}; then the device reported: {fault}" if result.message else \
            f"the device reported: {fault}"
    if result.outcome != FAIL:
        result.outcome, result.failure_class = FAIL, CRASH
    result.device_lost = True


def charged(result: RunResult, exc: Exception, repro) -> None:
    """`result` as what the run raised makes it (a Crash, the kit's out of memory, its time limit
    in the kit's code); `repro()`: the command that re-runs it, for a run that timed out."""
    if isinstance(exc, KitOutOfMemory):
        result.outcome, result.failure_class = ERROR, ENVIRONMENT
        result.message = (f"{exc}; {exc.why}, after releasing what it keeps and retrying once: not a verdict on "
                          f"the backend; run it again (with fewer processes on the device)")
    elif isinstance(exc, Crash):
        result.outcome, result.failure_class, result.message = FAIL, CRASH, str(exc)
        result.device_lost = exc.device_lost
        if exc.timed_out:
            result.repro = repro()
    else:  # RunTimeout, in the kit's own code, between backend calls
        result.outcome, result.failure_class, result.message = FAIL, CRASH, f"{exc} in the kit, between backend calls"
        result.repro = repro()
