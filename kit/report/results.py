"""Writing results: one record per run (kit.report.record), plus where, when and with what it ran."""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from kit.report.record import SCHEMA, RunResult

# torch is imported in the functions that need it: the xdist controller imports this module and
# should not wait for torch before it starts its workers.

REPO = Path(__file__).resolve().parents[2]


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


def results_text(records: List[Dict], run: Optional[Dict] = None) -> str:
    """A results file's text: records in run-id order, keys sorted, so equal contents are equal bytes."""
    doc = {"schema": SCHEMA, "records": sorted(records, key=lambda r: (r["backend"], r["mode"], r["exec"], r["case"]))}
    if run is not None:
        doc["run"] = run
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_text(path, text: str) -> None:
    """Atomic: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_results(path: str, records: List[Dict], run: Optional[Dict] = None) -> None:
    """`run`: what the session selected and how it ended (kit.report.record.ResultsFile's status,
    selected, catalog)."""
    write_text(path, results_text(records, run))
