"""Runner modes and execution kinds, named as serving engines name them.

A leaf: no torch, nothing of the kit, so that every layer (the report included) can name a
mode. A mode is its rules file, `kit/engine/modes/<mode>.py`, and its catalog file,
`cases/<mode>.py`, both found by the mode's value: the members of ForwardMode are the rules
files there (listed here, not imported), in the tables' column order: the modes below first,
then any other in name order.
"""
from __future__ import annotations

import enum
from pathlib import Path

# The tables' column order of the modes the kit ships; a new mode's file needs no entry here.
COLUMN_ORDER = ("decode", "extend", "mixed", "target_verify", "draft_extend_v2", "draft_decode")
_RULES_DIR = Path(__file__).resolve().parent / "engine" / "modes"
_NOT_A_MODE = {"__init__", "rules"}


def _mode_values():
    found = {p.stem for p in _RULES_DIR.glob("*.py") if p.stem not in _NOT_A_MODE and not p.stem.startswith("_")}
    return [v for v in COLUMN_ORDER if v in found] + sorted(found - set(COLUMN_ORDER))


ForwardMode = enum.Enum("ForwardMode", [(value.upper(), value) for value in _mode_values()],
                        module=__name__, qualname="ForwardMode")
ForwardMode.__doc__ = "A runner mode: one member per rules file in kit/engine/modes/, its value the file's name."


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
