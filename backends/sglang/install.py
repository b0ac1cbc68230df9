"""python -m backends.sglang.install — make the pinned sglang usable by the kit.

On a serving machine that has sglang already: nothing is installed, the installed
sglang is used as it is (a version other than the pin is named, not replaced). Else
(CPU CI): `pip install --no-deps -r requirements-cpu.txt`, the sglang wheel and the
packages its attention import chain imports, never its serving stack.
"""
from __future__ import annotations

import sys
from pathlib import Path

from backends import pinned
from backends.sglang.adapter import PINNED

REQUIREMENTS = Path(__file__).with_name("requirements-cpu.txt")


def main() -> int:
    return pinned.install("sglang", PINNED, [REQUIREMENTS], f"sglang {PINNED}'s attention backends are ready "
                                                             "(`python -m kit list --backends --check` lists them)")


if __name__ == "__main__":
    sys.exit(main())
