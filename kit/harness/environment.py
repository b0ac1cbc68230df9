"""What a record says of where it ran: the device, the kit's commit, the date, and the versions of
torch, CUDA and the backend's libraries. torch is imported in the functions that need it: the
xdist controller imports this module and should not wait for torch before it starts its workers."""
from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import platform
import subprocess
from typing import Dict

from kit.report.record import RunResult
from kit.report.results import REPO


def _kit_commit() -> str:
    if os.environ.get("KIT_COMMIT"):  # a copy of the tree without .git (e.g. one copied to a GPU machine)
        return os.environ["KIT_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "kit", "cases", "backends"],
                               capture_output=True, text=True, timeout=10)
        commit = out.stdout.strip() or "unknown"
        return commit + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name() -> str:
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()})"


@functools.lru_cache(maxsize=1)
def environment() -> Dict[str, str]:
    """kit.report.record.ENVIRONMENT_FIELDS of this process."""
    return {
        "device": device_name(),
        "kit_commit": _kit_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
    }


def versions(backend_cls=None) -> Dict[str, str]:
    """torch and CUDA, then what the backend reports of its own libraries (its `versions()`)."""
    import torch
    out = {"torch": torch.__version__, "cuda": torch.version.cuda or "none"}
    own = getattr(backend_cls, "versions", None)
    if callable(own):
        out.update(own())
    return out


def to_record(result: RunResult) -> Dict:
    return {**dataclasses.asdict(result), **environment()}
