"""python -m backends.vllm.install — make the pinned vllm usable by the kit.

On a serving machine that has vllm already: nothing is installed, the installed vllm is used as it
is (a version other than the pin is named, not replaced). Else (CPU CI): `pip install --no-deps`
of SGLang's set (backends/sglang/requirements-cpu.txt: the serving-stack packages both engines'
attention import chains share; a no-op where SGLang's backends are installed) and
requirements-cpu.txt here (the vllm wheel and what its chain imports beyond that set), never
vLLM's serving stack.
"""
from __future__ import annotations

import sys
from pathlib import Path

from backends import pinned
from backends.sglang.install import REQUIREMENTS as SHARED
from backends.vllm.adapter import PINNED

REQUIREMENTS = Path(__file__).with_name("requirements-cpu.txt")


def main() -> int:
    return pinned.install("vllm", PINNED, [SHARED, REQUIREMENTS], f"vllm {PINNED}'s attention backends are ready "
                                                                  "(`python -m kit list --backends --check` lists them)")


if __name__ == "__main__":
    sys.exit(main())
