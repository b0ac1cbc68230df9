"""What `python -m kit list` prints: the catalog's cases, or each backend of a selection with what
it runs here, counted by the decision the runner makes (kit.harness.scope), the main reason for
what it does not run first, on lines a terminal shows whole."""
from __future__ import annotations

import collections
import dataclasses
import textwrap
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

from kit.engine.case import Case
from kit.engine.kinds.recurrent import RecurrentCase
from kit.modes import Exec, ForwardMode

WIDTH = 100  # the longest line a listing prints
INDENT = "    "


def case_lines(catalog, case_set: str, modes: Sequence[ForwardMode]) -> List[str]:
    """One line per case the matrix runs of each mode: the softmax cases, then the recurrent ones."""
    return [f"{mode.value:16} {case.name:36} bs={case.bs:<3} " + _shape(case)
            for mode in modes for case in catalog.matrix_cases(case_set, mode)]


def _shape(case) -> str:
    """What sets a case apart beside its mode, name and batch size."""
    if isinstance(case, RecurrentCase):
        return (f"{case.kind} {case.dtype} heads={case.heads} k={case.head_k_dim} v={case.head_v_dim} "
                f"prefix={case.prefix} new={case.new}" + (f" accepted={case.accepted}" if case.accepted else "")
                + (f" layers={'/'.join(case.layer_pattern)} full_heads={case.attention_heads} "
                   f"full_d={case.attention_head_dim}" if case.layer_pattern else ""))
    return (f"page={case.page:<3} {case.dtype} heads={case.heads} d={case.head_dim} layout={case.layout}"
            + (f" mla={case.kv_lora_rank}+{case.rope_dim}" if case.is_mla else "")
            + (f" inputs={case.inputs}" if case.inputs != "contiguous" else "")
            + (f" kv={case.kv_dtype}" if case.kv_dtype else ""))


@dataclasses.dataclass
class Scope:
    """What a backend runs of a selection: per exec, the cases it runs out of those selected;
    per reason, the cases it gives that reason for."""

    case_set: str
    cases: List[Case]  # the cases the selection gives the backend
    runs: Dict[Exec, int] = dataclasses.field(default_factory=collections.Counter)
    reasons: Dict[str, List[Case]] = dataclasses.field(default_factory=dict)
    of_set: int = 0  # the set's cases of the selected modes, where the selection narrows to ci_cases
    # Per reason: (declared by the backend's attributes, the catalog's cases of both sets it covers)
    weight: Dict[str, Tuple[bool, int]] = dataclasses.field(default_factory=dict)

    def main_reasons(self) -> List[str]:
        """The reasons, main first: those of `supports()` before those the backend's declarations
        give (a backend written for dense attention is not unavailable for lacking MLA), each
        by how many of the catalog's cases, of both sets, it covers (the smoke set is the CPU's:
        mostly fp32; a library missing covers every dtype)."""
        return sorted(self.reasons, key=self._rank)

    def _rank(self, reason: str) -> Tuple[bool, int, str]:
        declared, covers = self.weight.get(reason, (True, 0))
        return declared, -covers, reason


def scope(cls, caps, catalog, case_set: str, modes: Sequence[ForwardMode], execs: Sequence[Exec],
          ci_cases: Optional[dict]) -> Scope:
    from kit.harness.scope import cases_of

    cases = [case for mode in modes for case in cases_of(catalog, case_set, mode, ci_cases)]
    s = Scope(case_set, cases, of_set=sum(len(catalog.matrix_cases(case_set, m)) for m in modes) if ci_cases else 0)
    decided = {}  # (case, mode, exec) -> its decision: the selection's cases are among the catalog's, asked once

    def declined_once(case, exec_):
        key = (case.name, case.mode, exec_)
        if key not in decided:
            decided[key] = _declined(cls, caps, case, exec_)
        return decided[key]

    for case in cases:
        for exec_ in execs:
            found = declined_once(case, exec_)
            if found is None:
                s.runs[exec_] += 1
            elif case not in s.reasons.setdefault(found.reason, []):
                s.reasons[found.reason].append(case)
    covered = collections.Counter()
    for case in {case.name + case.mode.value: case for mode in modes for case in catalog.all_cases(mode).values()}.values():
        for exec_ in execs:
            found = declined_once(case, exec_)
            if found is not None and found.reason in s.reasons:
                covered[found.reason] += 1
                s.weight[found.reason] = (found.declared, covered[found.reason])
    return s


def _declined(cls, caps, case, exec_):
    from kit.harness.scope import Declined, declined

    try:
        return declined(cls, caps, case, exec_)
    except Exception as exc:  # noqa: BLE001 - a supports() that raises is what this reports
        return Declined(f"supports() raised {type(exc).__name__}: {exc}", declared=False)


def _wrapped(text: str, first: str) -> List[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=INDENT * 2,
                         break_on_hyphens=False) or [first]


def scope_lines(name: str, s: Scope, execs: Sequence[Exec]) -> List[str]:
    """`name available: ...` or `name unavailable: <main reason>`, then a line per other reason."""
    reasons = s.main_reasons()
    n = len(s.cases)
    if not any(s.runs.values()):
        first = reasons[0] if reasons else f"no {s.case_set} cases selected"
        out = _wrapped(f"{name} unavailable: {first}", "")
        rest = reasons[1:]
    else:
        counts = ", ".join(f"{e.value} {s.runs[e]}/{n}" for e in execs)
        out = _wrapped(f"{name} available: {counts} {s.case_set} cases", "")
        rest = reasons
    if s.of_set:
        out += _wrapped(f"ci_cases: {n} of its {s.of_set} {s.case_set} cases, under `--case-set auto` without "
                        f"CUDA; `--case-set {s.case_set}` runs all", INDENT)
    for reason in rest:
        given = len(s.reasons[reason])
        out += _wrapped(f"{given} case{'' if given == 1 else 's'}: {reason}", INDENT)
    return out


def _import_problem(cls) -> Optional[str]:
    """Why an engine adapter's engine does not import here (`load_engine`: seconds to minutes), or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an engine's import-time chatter is no answer of the listing's
            cls.load_engine()
    except Exception as exc:  # noqa: BLE001 - an engine installed but broken is what this reports
        return f"its engine does not import here ({type(exc).__name__}: {exc})"
    return None


def backend_lines(spec: str, catalog, case_set: str, modes: Sequence[ForwardMode], execs: Sequence[Exec],
                  narrow_to_ci: bool, check: bool) -> List[str]:
    """What `spec` runs of the selection here (kit.harness.scope decides), or why it cannot load.
    An engine adapter's engine is imported only with `check`: without it, the backend is never
    said to be available."""
    from kit.harness.capabilities import Capabilities
    from kit.harness.protocol import backend_problem
    from kit.harness.registry import load_backend

    try:
        cls = load_backend(spec)
    except Exception as exc:  # noqa: BLE001 - a backend that cannot load is what this reports
        return _wrapped(f"{spec} unavailable: cannot be loaded ({type(exc).__name__}: {exc})", "")
    problem = backend_problem(cls)
    try:
        caps = None if problem else Capabilities.of(cls)
    except TypeError as exc:
        problem = str(exc)
    # An engine adapter (a class with `load_engine`): its engine's pin is read from installed metadata,
    # and the engine imported only with `check`, for a backend that runs something here.
    engine = not problem and callable(getattr(cls, "load_engine", None))
    if engine:
        problem = getattr(cls, "installed_problem", lambda: None)()
    if problem:
        return _wrapped(f"{spec} unavailable: {problem}", "")
    if engine and not check:
        return _wrapped(f"{spec} not checked: its engine is imported only under `--check`", "")
    s = scope(cls, caps, catalog, case_set, modes, execs, caps.ci_cases if narrow_to_ci else None)
    problem = _import_problem(cls) if engine and any(s.runs.values()) else None
    if problem:
        return _wrapped(f"{spec} unavailable: {problem}", "")
    own = _wrapped(f"each run in a process of its own: {caps.own_process}", INDENT) if caps.own_process else []
    return scope_lines(spec, s, execs) + own
