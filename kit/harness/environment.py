"""What a record says of where it ran: the device, the kit's commit, the date, and the versions of
torch, CUDA and the backend's libraries. torch is imported in the functions that need it: the
xdist controller imports this module and should not wait for torch before it starts its workers."""
from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Dict

from kit.harness.registry import KIT_DISTRIBUTION
from kit.report.record import RunResult
from kit.report.results import REPO


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _checkout_commit(repo: Path) -> str:
    """The commit of the kit's own checkout at `repo` (+dirty where its code differs), or '' where
    `repo` is no checkout's top: git would answer with an enclosing repository's commit."""
    top = _git(repo, "rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != repo.resolve():
        return ""
    commit = _git(repo, "rev-parse", "--short=12", "HEAD")
    dirty = _git(repo, "status", "--porcelain", "--", "kit", "cases", "backends")
    return commit + ("+dirty" if dirty else "") if commit else ""


def _installed_version() -> str:
    """The installed package's version and the commit it was built from (pip records it for an
    install from a repository), `VERSION@unknown` where it recorded none, 'unknown' without one."""
    try:
        dist = importlib.metadata.distribution(KIT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
    try:
        commit = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info", {}).get("commit_id", "")
    except ValueError:
        commit = ""
    return f"{dist.version}@{commit[:12] or 'unknown'}"


def kit_commit(repo: Path = REPO) -> str:
    """The kit's version a record names: KIT_COMMIT where set (a copy of its tree without .git, e.g.
    one copied to a GPU machine), its checkout's commit, else the installed package's version."""
    return os.environ.get("KIT_COMMIT") or _checkout_commit(repo) or _installed_version()


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
        "kit_commit": kit_commit(),
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
