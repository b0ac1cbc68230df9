"""python -m backends.sglang.gpu_wheels WHEELS HOST_FREEZE OUT — the wheels to carry to a GPU host.

A GPU host without network gets sglang's stack as wheels (cp312 for its Python 3.12, e.g.
`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_34_x86_64
--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any
-r requirements-cpu.txt -d WHEELS`). From WHEELS it copies those of requirements-cpu.txt that
the host lacks at the pinned version (HOST_FREEZE: the host's `pip list --format=freeze`) into
OUT/1, OUT/2, ..., each under the device tool's 64 MiB a call (sglang's own wheel is 38 MB).
On the host, per folder carried: `pip install --no-index --no-deps OUT/<n>/*.whl`.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from backends.sglang.install import REQUIREMENTS

CARRY_BYTES = 60 << 20  # the tool's 64 MiB, less the working tree carried with it


def _key(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def main(wheels: str, host_freeze: str, out: str) -> int:
    pins = [line.split("==") for line in REQUIREMENTS.read_text().splitlines() if "==" in line and line[0] != "#"]
    host = {_key(n): v.strip() for n, _, v in (line.partition("==") for line in Path(host_freeze).read_text().split())}
    files = {_key(p.name.split("-")[0]): p for p in Path(wheels).glob("*.whl")}
    missing = [(name, version) for name, version in pins if host.get(_key(name)) != version]
    lacking = [name for name, _ in missing if _key(name) not in files]
    if lacking:
        print(f"no wheel in {wheels} for: {', '.join(lacking)}", file=sys.stderr)
        return 1
    carries, size = [[]], 0
    for path in sorted((files[_key(name)] for name, _ in missing), key=lambda p: -p.stat().st_size):
        if size + path.stat().st_size > CARRY_BYTES:
            carries.append([])
            size = 0
        carries[-1].append(path)
        size += path.stat().st_size
    for n, paths in enumerate(carries, 1):
        folder = Path(out) / str(n)
        folder.mkdir(parents=True, exist_ok=True)
        for path in paths:
            shutil.copy(path, folder)
        print(f"{folder}: {len(paths)} wheels, {sum(p.stat().st_size for p in paths) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
