"""python -m backends.sglang.gpu_wheels WHEELS TARGET_FREEZE OUT — the wheels an offline machine lacks.

For a machine without network (docs/sglang.md, "A machine without network"): WHEELS is a folder
of wheels of requirements-cpu.txt for the target's Python and platform (e.g. `pip download
--no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_34_x86_64
--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any
-r requirements-cpu.txt -d WHEELS`). It copies into OUT those the target lacks at the pinned
version (TARGET_FREEZE: the target's `pip list --format=freeze`); on the target,
`pip install --no-index --no-deps OUT/*.whl`.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from backends.sglang.install import REQUIREMENTS


def _key(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def main(wheels: str, target_freeze: str, out: str) -> int:
    pins = [line.split("==") for line in REQUIREMENTS.read_text().splitlines() if "==" in line and line[0] != "#"]
    target = {_key(n): v.strip() for n, _, v in (line.partition("==") for line in Path(target_freeze).read_text().split())}
    files = {_key(p.name.split("-")[0]): p for p in Path(wheels).glob("*.whl")}
    missing = [(name, version) for name, version in pins if target.get(_key(name)) != version]
    lacking = [name for name, _ in missing if _key(name) not in files]
    if lacking:
        print(f"no wheel in {wheels} for: {', '.join(lacking)}", file=sys.stderr)
        return 1
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [files[_key(name)] for name, _ in missing]
    for path in paths:
        shutil.copy(path, folder)
    print(f"{folder}: {len(paths)} wheels, {sum(p.stat().st_size for p in paths) / 2**20:.1f} MiB; "
          f"on the target: pip install --no-index --no-deps {folder}/*.whl")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
