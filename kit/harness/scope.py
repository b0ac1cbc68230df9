"""Whether a backend runs a case: the one decision the runner, `python -m kit list --backends`,
the fuzzer and warmup all ask (`declined`, `unsupported_reason`); its reason is what the record
of an unsupported run says. And which cases a selection gives a backend (`cases_of`)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from kit.engine.case import Case
from kit.engine.kinds.recurrent import GRAPH_MODES, RecurrentCase
from kit.harness.capabilities import NO_CAPTURE_HOOKS, Capabilities
from kit.modes import Exec, ForwardMode


@dataclasses.dataclass(frozen=True)
class Declined:
    """Why a backend does not run a case, and whether its declarations say so (its attention
    kinds, KV dtypes, features, modes or graph hooks) rather than its `supports()`."""

    reason: str
    declared: bool


def declined(backend_cls, caps: Capabilities, case: Case, exec_: Exec) -> Optional[Declined]:
    """Why `backend_cls` (declaring `caps`) does not run `case` under `exec_`, or None where it
    does. Raises what the backend's `supports()` raises."""
    # The kind first: a backend written for dense attention need not know an MLA case's fields, nor one
    # of an engine that never schedules the step the case's.
    reason = caps.kind_reason(case) or caps.kv_dtype_reason(case) or caps.profile.unscheduled(case)
    if reason is None:
        said = backend_cls.supports(case)
        if said is not None:
            return Declined(str(said), declared=False)
    if reason is None:  # after supports(): a backend may say why it lacks a feature
        reason = caps.feature_reason(case)
    if reason is None:
        reason = caps.mode_reason(case.mode)
    if reason is None and exec_ is Exec.GRAPH:
        if isinstance(case, RecurrentCase):  # kit.harness.recurrent captures the step itself
            reason = recurrent_graph_reason(case)
        elif not caps.has_graph_hooks:
            reason = NO_CAPTURE_HOOKS
        if reason is None:  # a backend may capture some cases and not others (an engine's graph support per case)
            graph_reason = getattr(backend_cls, "supports_graph", None)
            said = graph_reason(case) if callable(graph_reason) else None
            if said is not None:
                return Declined(str(said), declared=False)
    return None if reason is None else Declined(reason, declared=True)


def recurrent_graph_reason(case: RecurrentCase) -> Optional[str]:
    """Why a recurrent case (of linear layers alone or a hybrid model's) has no graph run: its mode is
    not one the engines capture for these layers; or None."""
    if case.mode in GRAPH_MODES:
        return None
    return (f"{case.mode.value} of a recurrent layer is not captured in graphs (graph modes: "
            f"{', '.join(m.value for m in GRAPH_MODES)})")


def unsupported_reason(backend_cls, caps: Capabilities, case: Case, exec_: Exec) -> Optional[str]:
    """The reason of `declined`: what the record of an unsupported run says; None where it runs."""
    found = declined(backend_cls, caps, case, exec_)
    return None if found is None else found.reason


def narrows_to_ci(case_set_option: str, case_set: str) -> bool:
    """Whether a selection gives each backend that names `ci_cases` those cases alone: under
    `--case-set auto` resolved to `smoke` (no CUDA), the default run of a CPU."""
    return case_set_option == "auto" and case_set == "smoke"


def cases_of(catalog, case_set: str, mode: ForwardMode, ci_cases: Optional[Dict[str, Tuple[str, ...]]] = None
             ) -> List[Case]:
    """The cases of `mode` a selection gives a backend: the set's, or of those its `ci_cases`
    (where the selection narrows to them, else None)."""
    cases = catalog.matrix_cases(case_set, mode)
    if ci_cases is None:
        return cases
    return [case for case in cases if case.name in ci_cases.get(mode.value, ())]
