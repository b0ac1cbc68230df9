"""The case catalog: one line per case, grouped per mode, in a `smoke` set (CPU, CI)
and a `full` set (GPU)."""
from __future__ import annotations

from typing import Dict, List

import torch

from cases import decode, draft_extend_v2, extend, target_verify
from kit.case import Case
from kit.modes import ForwardMode

_BY_MODE = {
    ForwardMode.DECODE: decode,
    ForwardMode.EXTEND: extend,
    ForwardMode.TARGET_VERIFY: target_verify,
    ForwardMode.DRAFT_EXTEND_V2: draft_extend_v2,
}
CASE_SETS = ("smoke", "full")


def resolve_set(name: str) -> str:
    """`auto`: full where CUDA is present, smoke elsewhere."""
    if name == "auto":
        return "full" if torch.cuda.is_available() else "smoke"
    if name not in CASE_SETS:
        raise ValueError(f"unknown case set {name!r}; known: auto, {', '.join(CASE_SETS)}")
    return name


def cases(case_set: str, mode: ForwardMode) -> List[Case]:
    module = _BY_MODE[mode]
    return list(module.SMOKE if resolve_set(case_set) == "smoke" else module.FULL)


def all_cases(mode: ForwardMode) -> Dict[str, Case]:
    return {c.name: c for s in CASE_SETS for c in cases(s, mode)}


def find_case(mode: ForwardMode, name: str) -> Case:
    found = all_cases(mode)
    if name not in found:
        raise KeyError(f"no {mode.value} case named {name!r}; known: {', '.join(sorted(found))}")
    return found[name]
