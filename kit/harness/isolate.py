"""Running one case in a subprocess, so a device fault or hard crash cannot take the caller down."""
from __future__ import annotations

import subprocess
from typing import Optional

import torch

from kit.engine.case_line import format_case
from kit.harness import child
from kit.harness.capabilities import Capabilities
from kit.harness.registry import load_backend
from kit.harness.run import Run
from kit.harness.runner import execute, unsupported_here
from kit.report.known_failures import QUARANTINE
from kit.report.record import CRASH, FAIL, RunResult
from kit.harness.timeout import GRACE_S


def run_isolated(run: Run, timeout: Optional[float] = None, device: Optional[torch.device] = None) -> RunResult:
    """`timeout`: the run's limit, applied in the subprocess (which records the stage); the
    subprocess itself is ended if it outlives it by more than the grace period. `device`: where it runs
    (default: the subprocess's own default). A drawn case goes whole, as its line."""
    case = (["--case-line", format_case(run.case)] if run.drawn else
            ["--mode", run.case.mode.value, "--case", run.case.name, *(["--cases", run.catalog] if run.catalog else [])])
    cmd = child.command("kit", "run", "--backend", run.spec, "--exec", run.exec_.value, *case, "--json",
                        "--timeout", str(timeout or 0), *(["--device", device.type] if device is not None else []))
    crashed = run.record(outcome=FAIL, failure_class=CRASH, isolated=True)
    try:
        ended = child.run(cmd, timeout=timeout and timeout + 3 * GRACE_S)
    except subprocess.TimeoutExpired:
        crashed.message = f"timeout after {timeout:g} s: the subprocess was stuck and ended"
        return crashed
    record = ended.answer() if ended.returncode in (0, 1) else None
    if record is not None:
        record.update(backend=run.label, isolated=True)
        return RunResult(**record)
    crashed.message = f"subprocess died with {ended.death(3)}"
    return crashed


def in_own_process(run: Run) -> bool:
    """Whether `run` goes to a subprocess: its known failure is quarantined, or its backend declares that
    each of its runs needs a process of its own (`own_process`). A backend that does not load runs here,
    where its run says why."""
    if run.known is not None and run.known.mark == QUARANTINE:
        return True
    try:
        return Capabilities.of(load_backend(run.spec)).own_process is not None
    except Exception:  # noqa: BLE001 - the run itself reports a backend that fails to load or declare
        return False


def run_quarantined(run: Run, timeout: Optional[float] = None, device: Optional[torch.device] = None) -> RunResult:
    """A quarantined run: in a subprocess, unless its backend declines the case (known here
    without running it; a subprocess would cost its start for nothing)."""
    return unsupported_here(run) or run_isolated(run, timeout=timeout, device=device)


def dispatch(run: Run, timeout: Optional[float] = None, device: Optional[torch.device] = None) -> RunResult:
    """`run` where in_own_process puts it: a subprocess (run_quarantined), or this process. The suite,
    the fuzzer and the mutation scorer each run a run this way."""
    return run_quarantined(run, timeout, device) if in_own_process(run) else execute(run, device, timeout)
