"""Installing an engine at the version its adapter is pinned to, without its serving stack: the
engine's wheel and the packages its attention import chain imports, from requirement files,
with --no-deps (each engine's own requirements pin a CUDA torch and a full server). Used by
`python -m backends.<engine>.install`."""
from __future__ import annotations

import functools
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence


@functools.lru_cache(maxsize=None)
def installed_version(dist: str) -> Optional[str]:
    """`dist`'s installed version, or None; read once per process: every supports() call asks it
    (thousands a session), and each importlib.metadata lookup scans the whole environment."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def pin_problem(dist: str, pin: str, install_command: str) -> Optional[str]:
    """Why `dist` at `pin` is not what is installed (absent, or another version), or None."""
    version = installed_version(dist)
    if version is None:
        return f"{dist} {pin} is not installed: {install_command}"
    if version != pin:
        return f"{dist} {version} is installed, the adapter is pinned to {pin} (docs/{dist}.md says how to move the pin)"
    return None


def installed() -> Dict[str, str]:
    """name -> version of every distribution in this environment."""
    return {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}


def install(dist: str, pin: str, requirements: Sequence[Path], ready: str) -> int:
    """Installs `dist` at `pin` from `requirements` unless it is installed; another installed
    version is named, not replaced. `ready`: what to print once it is there. Returns an exit code."""
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
        for path in requirements:
            cmd += ["-r", str(path)]
        print(f"installing {dist} {pin} without its serving stack:", " ".join(cmd[2:]), flush=True)
        before = installed()
        code = subprocess.call(cmd)
        if code:
            print(f"{dist} install failed (pip exit code {code}); its backends read `unsupported`", file=sys.stderr)
            return code
        new = sorted(f"{name} {v}" for name, v in installed().items() if before.get(name) != v)
        print(f"installed {len(new)} packages: {', '.join(new)}")
        print(f"done: {ready}")
        return 0
    if version != pin:
        print(f"{dist} {version} is installed, the adapter is pinned to {pin}: its backends read `unsupported` until "
              f"the pin moves (docs/{dist}.md)", file=sys.stderr)
        return 1
    print(f"{dist} {version} is installed: using it as it is; nothing to install, done")
    return 0
