"""Runner modes and execution kinds, named as serving engines name them.

Each mode is one file here, `kit/modes/<mode>.py`, holding its rules (a
`kit.modes.rules.ModeRules` named RULES: case checks, request plan, batch
fields, padded rows at replay, graph contract), and one file of cases,
`cases/<mode>.py`. The enum is made from the files present, in the order
their `COLUMN = n` line gives (the tables' column order), without importing
them: this module stays free of torch, so the report layer can use it.
"""
from __future__ import annotations

import ast
import enum
import importlib
from pathlib import Path
from typing import List, Tuple

_NOT_MODES = {"__init__", "rules"}


def _declared_modes() -> List[str]:
    found: List[Tuple[int, str]] = []
    for path in Path(__file__).parent.glob("*.py"):
        if path.stem in _NOT_MODES:
            continue
        column = [node.value.value for node in ast.parse(path.read_text()).body
                  if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["COLUMN"]
                  and isinstance(node.value, ast.Constant)]
        if len(column) != 1:
            raise ImportError(f"{path}: a mode file needs one `COLUMN = <int>` line (its table column)")
        found.append((column[0], path.stem))
    return [name for _, name in sorted(found)]


class _Mode(enum.Enum):
    """Members are made from kit/modes/*.py (ForwardMode.DECODE, ...)."""

    @property
    def rules(self):
        """This mode's ModeRules (imports its file, which needs torch)."""
        return importlib.import_module(f"{__name__}.{self.value}").RULES


ForwardMode = _Mode("ForwardMode", [(name.upper(), name) for name in _declared_modes()], module=__name__)


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
