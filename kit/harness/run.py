"""One run of the matrix: a backend x a case (its mode within) x an execution kind, with what
names it: the run id, the command that repeats it, and the skeleton of its record."""
from __future__ import annotations

import dataclasses
from typing import Optional

from kit.engine.case import Case
from kit.engine.case_line import format_case
from kit.harness.registry import import_root
from kit.modes import Exec
from kit.report.known_failures import KnownFailure
from kit.report.record import RunResult, repro_command, run_id


@dataclasses.dataclass(frozen=True)
class Run:
    spec: str  # the backend as loaded: a registered name or module:attr
    label: str  # the backend as recorded
    case: Case
    exec_: Exec
    known: Optional[KnownFailure] = None  # its KNOWN_FAILURES.md entry
    catalog: Optional[str] = None  # the catalog target the case came from, None for the in-box one
    drawn: bool = False  # the case is in no catalog (the fuzzer drew it): a command gives it whole, as its line

    @property
    def id(self) -> str:
        return run_id(self.label, self.case.mode.value, self.exec_.value, self.case.name)

    def repro(self, timeout: Optional[float] = None) -> str:
        """The command that repeats this run; with the time limit of a run that ran out of it."""
        return repro_command(self.spec, self.case.mode.value, self.exec_.value, self.case.name, self.catalog,
                             timeout, case_line=format_case(self.case) if self.drawn else None,
                             pythonpath=import_root(self.spec))

    def record(self, timeout: Optional[float] = None, **fields) -> RunResult:
        """This run's record, with `fields` (outcome, ...) filled in; `timeout` as for repro()."""
        return RunResult(backend=self.label, mode=self.case.mode.value, exec=self.exec_.value, case=self.case.name,
                         dtype=self.case.dtype, repro=self.repro(timeout), **fields)
