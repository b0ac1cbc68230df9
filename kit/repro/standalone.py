"""The standalone file of a run, by the engine of its backend's profile: one renderer per engine, and
one for a recurrent kind's step (kit.repro.recurrent_file)."""
from __future__ import annotations

import re

from kit.engine.case import Case
from kit.engine.kinds.recurrent import RecurrentCase
from kit.modes import Exec
from kit.repro import recurrent_file, sglang_file, vllm_file
from kit.repro.scenario import NotReproducible, scenario

RENDERERS = {"vllm": vllm_file.render, "sglang": sglang_file.render}
# A renderer's placeholder (`@BACKEND@`), which every part that holds one must have filled.
PLACEHOLDER = re.compile(r"@[A-Z][A-Z0-9_]*@")


def filled(text: str, who: str) -> str:
    """`text`, once no placeholder is left in it (one left is a renderer's bug: the file would not parse)."""
    left = sorted(set(PLACEHOLDER.findall(text)))
    if left:
        raise RuntimeError(f"{who}'s standalone file left {', '.join(left)} unfilled: a bug of kit/repro's renderer")
    return text


def standalone(backend_cls, case: Case, exec_: Exec, origin: str) -> str:
    """The text of a Python file that reproduces `backend_cls` on `case` in `exec_` with only its engine
    and torch; `origin`: where the case comes from, for the file's opening (the record, what it was
    shrunk from)."""
    engine = backend_cls.profile.name
    if engine not in RENDERERS:
        raise NotReproducible(f"{backend_cls.name}: no standalone renderer for {engine} backends yet "
                              f"({', '.join(sorted(RENDERERS))} have one)")
    if isinstance(case, RecurrentCase):  # a recurrent step, not batches of KV pages: a renderer of its own
        text = recurrent_file.render(case, backend_cls, exec_, origin)
    else:
        text = RENDERERS[engine](scenario(case, backend_cls.profile, exec_, origin, backend_cls.numerics), backend_cls,
                                 exec_.value)
    return filled(text, backend_cls.name)
