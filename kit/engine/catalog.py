"""A case catalog: per mode, a `smoke` set (CPU, CI) and a `full` set (GPU).

The in-box catalog is the `cases` package (`cases:CATALOG`, one file per mode, and the recurrent
kinds' cases of every mode in one file, kept apart: the softmax tools take `Case`s alone);
`--cases module:attr` names another, built the same way."""
from __future__ import annotations

import importlib
from typing import Dict, List, Optional, Union

from kit.engine.case import Case
from kit.engine.kinds.recurrent import RecurrentCase
from kit.modes import MODES, ForwardMode
from kit.targets import import_target

CASE_SETS = ("smoke", "full")
DEFAULT_CATALOG = "cases:CATALOG"


def resolve_set(name: str) -> str:
    """`auto`: full where CUDA is present, smoke elsewhere."""
    if name == "auto":
        import torch
        return "full" if torch.cuda.is_available() else "smoke"
    if name not in CASE_SETS:
        raise ValueError(f"unknown case set {name!r}; known: auto, {', '.join(CASE_SETS)}")
    return name


class Catalog:
    def __init__(self, sets: Dict[ForwardMode, Dict[str, List[Case]]],
                 recurrent: Optional[Dict[ForwardMode, Dict[str, List[RecurrentCase]]]] = None):
        self.sets = sets  # mode -> case set -> softmax cases
        self.recurrent = recurrent or {}  # mode -> case set -> recurrent cases (kit.harness.recurrent runs them)

    @classmethod
    def from_package(cls, package: str, recurrent: Optional[str] = None) -> "Catalog":
        """`<package>.<mode>` modules with SMOKE and FULL lists; a mode without a module has no cases.
        `recurrent`: a module of the package whose SMOKE and FULL lists hold recurrent cases of
        every mode (cases/linear.py)."""
        sets = {}
        for mode in MODES:
            try:
                module = importlib.import_module(f"{package}.{mode.value}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{mode.value}":
                    raise
                continue
            sets[mode] = {"smoke": list(module.SMOKE), "full": list(module.FULL)}
        by_mode: Dict[ForwardMode, Dict[str, List[RecurrentCase]]] = {}
        if recurrent:
            module = importlib.import_module(f"{package}.{recurrent}")
            for case_set, cases in (("smoke", module.SMOKE), ("full", module.FULL)):
                for case in cases:
                    by_mode.setdefault(case.mode, {s: [] for s in CASE_SETS})[case_set].append(case)
        return cls(sets, by_mode)

    def cases(self, case_set: str, mode: ForwardMode) -> List[Case]:
        """The softmax cases (what fixtures, the fuzzer and mutation scoring take)."""
        return list(self.sets.get(mode, {}).get(resolve_set(case_set), []))

    def matrix_cases(self, case_set: str, mode: ForwardMode) -> List[Union[Case, RecurrentCase]]:
        """What the matrix runs of the mode: the softmax cases, then the recurrent ones."""
        return self.cases(case_set, mode) + list(self.recurrent.get(mode, {}).get(resolve_set(case_set), []))

    def all_cases(self, mode: ForwardMode) -> Dict[str, Case]:
        return {c.name: c for s in CASE_SETS for c in self.cases(s, mode)}

    def find_case(self, mode: ForwardMode, name: str) -> Union[Case, RecurrentCase]:
        """The mode's case named `name`, of either set, softmax or recurrent."""
        found = {c.name: c for s in CASE_SETS for c in self.matrix_cases(s, mode)}
        if name not in found:
            raise KeyError(f"no {mode.value} case named {name!r}; known: {', '.join(sorted(found))}")
        return found[name]


def load_catalog(target: Optional[str] = None) -> Catalog:
    """The catalog at `module:attr` (default: the in-box one)."""
    catalog = import_target(target or DEFAULT_CATALOG)
    if not isinstance(catalog, Catalog):
        raise TypeError(f"{target}: not a kit.engine.catalog.Catalog (build one with Catalog.from_package)")
    return catalog
