"""Mutation scoring: run the conformance suite against a mutant backend and say
whether the kit caught it, with which failure classes, and where first.

Each mutant runs in its own process: a mutant that corrupts memory or faults
the device is caught as a crash and cannot take the next one down with it.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from kit.engine.case import Case
from kit.engine.catalog import load_catalog
from kit.modes import Exec, ForwardMode
from kit.report import known_failures
from kit.report.record import CRASH, FAIL, UNSUPPORTED, parse_run_id, repro_command, run_id
from kit.harness import child
from kit.harness.environment import device_name
from kit.harness.capabilities import Capabilities
from kit.harness.registry import load_backend
from kit.targets import import_target
from kit.harness.isolate import dispatch
from kit.harness.run import Run
from kit.harness.timeout import DEFAULT_S


@dataclasses.dataclass(frozen=True)
class Mutant:
    number: int  # the bug class's number in the mutation issue
    name: str
    backend: str  # module:attr of the mutated backend
    expect: Tuple[str, ...]  # the failure classes the kit may report (any one catches it)
    modes: Tuple[ForwardMode, ...]
    execs: Tuple[Exec, ...]
    cpu: bool  # catchable on CPU (interpreter, emulated graphs)
    # Why this mutant changes nothing the contract judges for this backend (only
    # finite output of padded rows, say): it is still run and shown, with the reason.
    harmless: str = ""
    # The cases the bug class shows in (a window, a tree mask, a dtype other than the kernels'
    # fp32): a run stopping at its first catch tries them first. Every run stays in the score.
    reaches: Optional[Callable[[Case], bool]] = None

    @property
    def doc(self) -> str:
        return " ".join((load_backend(self.backend).__doc__ or "").split())


@dataclasses.dataclass
class Score:
    mutant: Mutant
    runs: int = 0
    failed: int = 0
    classes: Dict[str, int] = dataclasses.field(default_factory=dict)
    first_failure: str = ""
    repro: str = ""
    not_run: int = 0  # runs not made: the process died or lost the device, or stopped at the first catch
    # Runs left out: the unmutated backend is a known failure there (KNOWN_FAILURES.md) and the entry
    # pins no band (any failure of its class), or the mutant's failure stays inside the entry's band:
    # such a failure cannot tell the mutant from the engine's own bug.
    known: int = 0

    @property
    def caught(self) -> bool:
        return any(c in self.classes for c in self.mutant.expect)

    def to_record(self) -> Dict:
        m = self.mutant
        return dict(number=m.number, mutant=m.name, expect=list(m.expect), harmless=m.harmless,
                    runs=self.runs, failed=self.failed,
                    classes=self.classes, first_failure=self.first_failure, repro=self.repro,
                    not_run=self.not_run, known=self.known, caught=self.caught)


def _runs(mutant: Mutant, case_set: str, cases: Optional[str], stop_when_caught: bool = False):
    """(the mutant's runs in catalog order (the cases of the attention kinds its backend declares, softmax
    and recurrent), each (case, exec, the unmutated backend's known failure
    there where its entry pins what it expects: a band or a message), how many were left out as known
    failures whose entry pins nothing); to stop at the first catch, those of the cases it reaches
    first (the others follow, in case a run catches it where none was expected), the smallest first."""
    catalog = load_catalog(cases)
    cls = load_backend(mutant.backend)
    kinds = Capabilities.of(cls).attention_kinds  # a case of another kind is unsupported: not a run to make
    runs = [(case, ex) for mode in mutant.modes for case in catalog.matrix_cases(case_set, mode)
            if case.kind in kinds for ex in mutant.execs]
    base, device = cls.name, device_name()
    entries = known_failures.of_backend(known_failures.load_or_default(), base, device)
    judged = []
    for case, ex in runs:
        entry = known_failures.match(entries, base, case.mode.value, ex.value, case.name, device, case.dtype)
        if entry is None or entry.pinned:
            judged.append((case, ex, entry))
    if stop_when_caught:
        judged.sort(key=lambda run: (mutant.reaches is not None and not mutant.reaches(run[0]), run[0].size))
    return judged, len(runs) - len(judged)


def score(mutant: Mutant, case_set: str, stop_when_caught: bool = False, progress=None,
          cases: Optional[str] = None, timeout: Optional[float] = None) -> Score:
    """Every run of the mutant's modes x execs over the case set (or up to the first
    run failing with the expected class), in this process, or a subprocess where the suite would
    give the run one (kit.harness.isolate.dispatch). `progress(test_id)` is
    called before each run; `timeout`: each run's limit, as a matrix run's (kit.harness.timeout:
    past it the run is a crash, and a run stuck in native code ends the process)."""
    classes = collections.Counter()
    runs, known = _runs(mutant, case_set, cases, stop_when_caught)
    s = Score(mutant, known=known)
    for i, (case, ex, entry) in enumerate(runs):
        if progress:
            progress(run_id(mutant.name, case.mode.value, ex.value, case.name))
        result = dispatch(Run(mutant.backend, mutant.name, case, ex, known=entry, catalog=cases), timeout=timeout)
        if result.outcome == UNSUPPORTED:
            continue
        if known_failures.is_expected(entry, result):  # inside the engine's own known failure's band
            s.known += 1
            continue
        s.runs += 1
        if result.outcome == FAIL:
            s.failed += 1
            classes[result.failure_class] += 1
            if not s.first_failure:
                s.first_failure, s.repro = result.test_id, result.repro
        if result.device_lost or (stop_when_caught and result.failure_class in mutant.expect):
            s.not_run = len(runs) - i - 1  # nothing more can run in this process after a lost device
            break
    s.classes = dict(classes)
    return s


RUN, SCORE = "RUN ", "SCORE "


def worker(catalog: str, name: str, case_set: str, stop_when_caught: bool, cases: Optional[str] = None,
           timeout: Optional[float] = None) -> None:
    """`python -m kit.mutate --worker`: one mutant, progress and score on stdout."""
    mutant = next(m for m in import_target(catalog) if m.name == name)
    s = score(mutant, case_set, stop_when_caught, progress=lambda tid: print(RUN + tid, flush=True), cases=cases,
              timeout=timeout)
    print(SCORE + json.dumps(s.to_record()), flush=True)


def score_isolated(mutant: Mutant, catalog: str, case_set: str, stop_when_caught: bool = False,
                   cases: Optional[str] = None, timeout: Optional[float] = DEFAULT_S) -> Score:
    """score() in a subprocess: a mutant that kills its process (heap corruption, a
    device fault) is caught as a crash at the run it was in, and the caller lives; one that
    leaves it stuck (a corrupted heap can deadlock it) too, once the run's `timeout` ends it."""
    cmd = child.command("kit.mutate", "--worker", "--catalog", catalog, "--only", mutant.name, "--case-set", case_set,
                        "--timeout", str(timeout or 0),
                        *(["--stop-when-caught"] if stop_when_caught else []), *(["--cases", cases] if cases else []))
    ended = child.run(cmd)
    record = ended.answer(SCORE)
    if record is not None:
        return Score(mutant, runs=record["runs"], failed=record["failed"], classes=record["classes"],
                     first_failure=record["first_failure"], repro=record["repro"], not_run=record["not_run"],
                     known=record["known"])
    started = [line[len(RUN):] for line in ended.stdout.splitlines() if line.startswith(RUN)]
    if not started:
        raise RuntimeError(f"mutant worker for {mutant.name} failed before any run ({ended.death(20)})")
    _, mode, exec_, case = parse_run_id(started[-1])
    repro = repro_command(mutant.backend, mode, exec_, case, cases)
    runs, known = _runs(mutant, case_set, cases, stop_when_caught)
    return Score(mutant, runs=len(started), failed=1, classes={CRASH: 1}, first_failure=started[-1],
                 repro=f"{repro}  # process died, {ended.death()}", not_run=len(runs) - len(started), known=known)


def score_all(mutants: Sequence[Mutant], catalog: str, case_set: str, jobs: int,
              stop_when_caught: bool = False, cases: Optional[str] = None,
              timeout: Optional[float] = DEFAULT_S) -> List[Score]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda m: score_isolated(m, catalog, case_set, stop_when_caught, cases, timeout),
                             mutants))
