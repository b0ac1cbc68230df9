"""python -m backends.sglang.install — make the pinned sglang usable by the kit.

On a serving machine that has sglang already: nothing is installed, the installed
sglang is used as it is (a version other than the pin is named, not replaced). Else
(CPU CI): `pip install --no-deps -r requirements-cpu.txt`, the sglang wheel and the
packages its attention import chain imports, never its serving stack.
"""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

from backends.sglang.adapter import PINNED

REQUIREMENTS = Path(__file__).with_name("requirements-cpu.txt")


def installed() -> dict:
    """name -> version of every distribution in this environment."""
    return {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}


def main() -> int:
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "-r", str(REQUIREMENTS)]
        print("installing sglang", PINNED, "without its serving stack:", " ".join(cmd[2:]), flush=True)
        before = installed()
        code = subprocess.call(cmd)
        if code:
            print(f"sglang install failed (pip exit code {code}); SGLang's backends read `unsupported`",
                  file=sys.stderr)
            return code
        new = sorted(f"{name} {v}" for name, v in installed().items() if before.get(name) != v)
        print(f"installed {len(new)} packages: {', '.join(new)}")
        print(f"done: sglang {PINNED}'s attention backends are ready (`python -m kit list --backends` lists them)")
        return 0
    if version != PINNED:
        print(f"sglang {version} is installed, the adapter is pinned to {PINNED}: its backends read "
              f"`unsupported` until the pin moves (docs/sglang.md)", file=sys.stderr)
        return 1
    print(f"sglang {version} is installed: using it as it is; nothing to install, done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
