"""Runner modes and execution kinds, named as serving engines name them.

A leaf: no torch, nothing of the kit, so that every layer (the report included)
can name a mode. The members are listed in the tables' column order. A mode's
rules live in `kit/engine/modes/<mode>.py` and its cases in `cases/<mode>.py`,
both found by the member's value (kit.engine.modes.rules_for, kit.engine.catalog).
"""
from __future__ import annotations

import enum


class ForwardMode(enum.Enum):
    DECODE = "decode"
    EXTEND = "extend"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND_V2 = "draft_extend_v2"


class Exec(enum.Enum):
    EAGER = "eager"
    GRAPH = "graph"


MODES = tuple(ForwardMode)
EXECS = tuple(Exec)


def parse_mode(name: str) -> ForwardMode:
    try:
        return ForwardMode(name.lower())
    except ValueError:
        raise ValueError(f"unknown mode {name!r}; known: {[m.value for m in MODES]}") from None


def parse_exec(name: str) -> Exec:
    try:
        return Exec(name.lower())
    except ValueError:
        raise ValueError(f"unknown exec {name!r}; known: {[e.value for e in EXECS]}") from None
