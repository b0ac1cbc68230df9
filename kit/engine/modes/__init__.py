"""The registry of mode rules: one `kit/engine/modes/<mode>.py` per kit.modes.ForwardMode
member, named by its value, holding a `ModeRules` named RULES (case checks, request plan,
batch fields, padded rows at replay, graph buckets). Importing this module imports no torch
(a case checks itself against its rules, and the xdist controller imports cases); a mode's
file is imported when its rules are first asked for."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kit.modes import ForwardMode

if TYPE_CHECKING:
    from kit.engine.modes.rules import ModeRules


def rules_for(mode: ForwardMode) -> "ModeRules":
    """The rules of `mode`."""
    return importlib.import_module(f"{__name__}.{mode.value}").RULES
