"""The search: Hypothesis draws cases (kit.fuzz.strategies), each runs eager and graph through the
suite's own runner and verdicts (kit.harness.isolate.dispatch), and a failure is shrunk to a
minimal case failing the same way (same mode, exec and failure class).

A failure KNOWN_FAILURES.md expects (kit.report.known_failures) is counted as known, with its
KF id, and the search goes on: only new failures are shrunk. Time is bounded: once the budget
is spent (the search's, then the shrink's, which starts at the first failure) the next case
not seen before stops Hypothesis (OutOfTime), and each failure is reported as the smallest
case seen failing that way (`size`); a shrink that ends in time is reported as Hypothesis
shrank it.
"""
from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, reject, seed as hypothesis_seed, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Unsatisfiable

from kit.engine.case import Case
from kit.engine.case_line import format_case
from kit.fuzz import in_flight
from kit.engine.draws import Takes
from kit.engine.features import FEATURES, features_of
from kit.engine.kinds.recurrent import RecurrentCase
from kit.fuzz.strategies import any_case, case_fields, case_name
from kit.harness.registry import backend_label, load_backend
from kit.harness.capabilities import Capabilities
from kit.harness.isolate import dispatch
from kit.harness.run import Run
from kit.harness.scope import unsupported_reason
from kit.modes import Exec, ForwardMode
from kit.report.known_failures import KnownFailure, against, is_expected, match
from kit.report.record import ERROR, FAIL, KIT_ERROR
from kit.harness.environment import environment

try:
    BaseExceptionGroup
except NameError:  # Python 3.10: Hypothesis's own dependency
    from exceptiongroup import BaseExceptionGroup



@dataclasses.dataclass
class Target:
    """What one fuzz run searches: a backend over modes x execs, cases of one size."""

    backend: str
    modes: Tuple[ForwardMode, ...]
    execs: Tuple[Exec, ...]
    size: str = "small"
    device: Optional[str] = None  # default: cuda when present
    timeout: Optional[float] = None  # seconds per run (kit.harness.timeout)


@dataclasses.dataclass
class Finding:
    """A failing run: the case, how it failed, and the known-failure entry that expects it, if any."""

    case: Case
    exec: str
    failure_class: str
    message: str
    repro: str
    known: Optional[str] = None  # KF id
    example: int = 0  # cases tried when it was first seen
    seconds: float = 0.0  # since the start, when it was first seen

    @property
    def line(self) -> str:
        return format_case(self.case)

    def to_record(self) -> Dict:
        return dict(mode=self.case.mode.value, exec=self.exec, failure_class=self.failure_class,
                    known=self.known, case_line=self.line, repro=self.repro, message=self.message,
                    example=self.example, seconds=round(self.seconds, 2))


@dataclasses.dataclass
class Outcome:
    """What a fuzz run did and found (the ledger's record, kit.fuzz.ledger)."""

    seed: int
    examples: int = 0  # cases run (each on every selected exec)
    runs: int = 0  # backend runs made
    unsupported: int = 0  # cases drawn that the backend does not take (not run)
    search_seconds: float = 0.0
    shrink_seconds: float = 0.0
    new: List[Finding] = dataclasses.field(default_factory=list)  # shrunk, one per distinct failure
    known: Dict[str, Tuple[int, Finding]] = dataclasses.field(default_factory=dict)  # KF id -> (count, first)
    stopped: str = ""  # why it ended early (the device lost), or ""
    first_example: int = 0  # cases run when the first new failure was seen (0: none)
    shrunk: bool = True  # False: the shrink budget ran out, each failure is the smallest case seen so far

    def to_record(self) -> Dict:
        return dict(seed=self.seed, examples=self.examples, runs=self.runs, unsupported=self.unsupported,
                    search_seconds=self.search_seconds, shrink_seconds=self.shrink_seconds,
                    seconds=round(self.search_seconds + self.shrink_seconds, 2), first_example=self.first_example,
                    shrunk=self.shrunk,
                    new=[f.to_record() for f in self.new], stopped=self.stopped,
                    known={kf: dict(count=n, first=f.to_record()) for kf, (n, f) in sorted(self.known.items())})


INTERRUPTED = "interrupted (Ctrl-C)"  # Outcome.stopped's start when the user stopped the search


class OutOfTime(BaseException):
    """Ends Hypothesis's run at once (it lets through what is no Exception): rejecting case after
    case would have it draw hundreds more before it gives up."""


# The features a found case drops where its failure does not need them, each to its plain value
# (kit.engine.features: those `dropped`). Hybrid layers first: the model's other layer toggles the case's
# window and cap, so a window bug still fails without the case's own window while hybrid; dropped first,
# the case's own layer keeps what it needs.
DROPS: Tuple[Tuple[str, type, Dict], ...] = tuple(sorted(
    ((f.name, f.case, f.fields(f.values[0])) for f in FEATURES if f.dropped), key=lambda drop: drop[0] != "hybrid"))


def size(case) -> Tuple:
    """How large a case is, for the smallest failing one: requests, tokens, head sizes, page, and
    how many features are on."""
    width = case.heads[1] * case.head_v_dim if isinstance(case, RecurrentCase) else case.heads[0] * case.head_dim
    return (case.bs, sum(case.prefix) + sum(case.new_lens), width, getattr(case, "page", 1),
            sum(f.on(case) for f in features_of(case) if f.sized), format_case(case))


class Failed(Exception):
    """A new failure of a drawn case. Hypothesis shrinks each subclass on its own, so one is made
    per mode, exec and failure class: a shrunk case fails the way the found one did."""

    finding: Finding
    _kinds: Dict[str, type] = {}

    @staticmethod
    def kind(finding: Finding) -> str:
        return f"{finding.case.mode.value}_{finding.exec}_{finding.failure_class}".replace("-", "_")

    @classmethod
    def of(cls, finding: Finding) -> "Failed":
        name = cls.kind(finding)
        kind = cls._kinds.setdefault(name, type(name, (cls,), {}))
        err = kind(f"[{finding.failure_class}] {finding.message}")
        err.finding = finding
        return err


class Namespaced(ExampleDatabase):
    """One example database for every target, each target's examples under its own keys (the
    search's test function is the same for all)."""

    def __init__(self, db: ExampleDatabase, namespace: str):
        super().__init__()
        self.db, self.prefix = db, namespace.encode() + b"/"

    def save(self, key, value):
        self.db.save(self.prefix + key, value)

    def fetch(self, key):
        return self.db.fetch(self.prefix + key)

    def delete(self, key, value):
        self.db.delete(self.prefix + key, value)

    def move(self, src, dest, value):
        self.db.move(self.prefix + src, self.prefix + dest, value)


class _Search:
    def __init__(self, target: Target, known: Sequence[KnownFailure], budget: float, shrink_budget: float,
                 outcome: Outcome, running: Optional[Path] = None):
        self.target, self.known_entries, self.outcome = target, known, outcome
        self.running = running  # kit.fuzz.in_flight's file, or None
        self.budget, self.shrink_budget = budget, shrink_budget
        self.device = torch.device(target.device) if target.device else None
        self.device_label = environment()["device"]
        self.cls = load_backend(target.backend)
        self.caps = Capabilities.of(self.cls)
        self.label = backend_label(target.backend)  # as the suite names it: KNOWN_FAILURES.md's backend column
        self.start = time.perf_counter()
        self.first_failure: Optional[float] = None
        self.seen: Dict[str, Optional[Finding]] = {}  # case line -> its new failure, None if none
        self.smallest: Dict[str, Finding] = {}  # Failed.kind -> the smallest case seen failing so

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def out_of_time(self) -> bool:
        if self.outcome.stopped:
            return True
        if self.first_failure is None:
            return self.elapsed() > self.budget
        return self.elapsed() > self.first_failure + self.shrink_budget

    def attempt(self, case: Case) -> None:
        """Hypothesis's test function: raises Failed for a new failure, from this one line (Hypothesis
        tells failures apart by where they are raised, too)."""
        finding = self._verdict(case)
        if finding is not None:
            raise Failed.of(finding)

    def _verdict(self, case: Case) -> Optional[Finding]:
        line = format_case(case)
        if line in self.seen:  # the shrinker's and the final report's repeats: the same verdict, not run again
            return self.seen[line]
        if self.out_of_time():
            raise OutOfTime()
        execs = [e for e in self.target.execs if unsupported_reason(self.cls, self.caps, case, e) is None]
        if not execs:
            self.outcome.unsupported += 1
            reject()
        self.outcome.examples += 1
        finding = None
        for exec_ in execs:
            finding = self._run(case, exec_)
            if finding is not None:
                break
        self.seen[line] = finding
        if finding is not None:
            kind = Failed.kind(finding)
            if kind not in self.smallest or size(case) <= size(self.smallest[kind].case):
                self.smallest[kind] = finding
        return finding

    def without_unneeded_features(self, finding: Finding) -> Finding:
        """The finding's case with every feature (DROPS) its failure does not need dropped, one at a time:
        each drop kept where the case still fails the same way (mode, exec, failure class), as a new
        failure. Hypothesis shrinks toward plain values but may stop short (its budget, or a drop that
        only works once another is made); this pass makes the case say what the bug needs."""
        for _, of, fields in DROPS:
            if isinstance(finding.case, of) and not all(getattr(finding.case, k) == v for k, v in fields.items()):
                finding = self.kept_if_same(finding, fields)
        return finding

    def kept_if_same(self, finding: Finding, changes: Dict) -> Finding:
        """The finding of the case with `changes` where that case fails the same way (mode, exec,
        failure class), else `finding`: a change that makes no valid case (an MLA case's scale, a
        mode's batch rule) or one the backend does not take is not kept."""
        try:
            changed = finding.case.with_(**changes)
            changed = changed.with_(name=case_name(changed, case_fields(changed)))
        except ValueError:
            return finding
        exec_ = Exec(finding.exec)
        if unsupported_reason(self.cls, self.caps, changed, exec_) is not None:
            return finding
        again = self._run(changed, exec_)
        if again is None or Failed.kind(again) != Failed.kind(finding):
            return finding
        return dataclasses.replace(again, example=finding.example, seconds=finding.seconds)

    def fewer_requests(self, finding: Finding) -> Finding:
        """The finding's case with as few requests as still fail the same way: each request alone
        first, else one request dropped at a time while that fails."""
        for i in range(finding.case.bs if finding.case.bs > 1 else 0):
            alone = self.kept_if_same(finding, _requests(finding.case, [i]))
            if alone is not finding:
                return alone
        dropping = True
        while dropping and finding.case.bs > 1:
            dropping = False
            for i in range(finding.case.bs):
                fewer = self.kept_if_same(finding, _requests(finding.case, [j for j in range(finding.case.bs)
                                                                            if j != i]))
                if fewer is not finding:
                    finding, dropping = fewer, True
                    break
        return finding

    def shorter(self, finding: Finding) -> Finding:
        """Each request's cached and new lengths halved while the case still fails the same way."""
        for i in range(finding.case.bs):
            for field in ("prefix", "new"):
                while True:
                    lengths = _lengths(finding.case, field)
                    if lengths is None or lengths[i] <= (0 if field == "prefix" else 1):
                        break
                    halved = lengths[:i] + (lengths[i] // 2,) + lengths[i + 1:]
                    shorter = self.kept_if_same(finding, {field: halved})
                    if shorter is finding:
                        break
                    finding = shorter
        return finding

    def _run(self, case: Case, exec_: Exec) -> Optional[Finding]:
        t = self.target
        run = Run(t.backend, self.label, case, exec_, drawn=True)
        repro = run.repro()
        if self.running is not None:
            in_flight.write(self.running, dict(backend=t.backend, mode=case.mode.value, exec=exec_.value,
                                               case_line=format_case(case), repro=repro,
                                               example=self.outcome.examples, seconds=round(self.elapsed(), 2)))
        try:
            result = dispatch(run, t.timeout, self.device)
        except Exception as exc:  # noqa: BLE001 - the kit's own error on a drawn case is a finding too
            result = run.record(outcome=ERROR, failure_class=KIT_ERROR,
                                message=f"the kit raised {type(exc).__name__}: {exc}")
        self.outcome.runs += 1
        if result.device_lost:
            self.outcome.stopped = (f"the device was lost at example {self.outcome.examples} (a sticky device "
                                    f"fault): the failure is not shrunk; nothing more can run in this process")
        if result.outcome != FAIL and result.failure_class != KIT_ERROR:
            return None
        finding = Finding(case, exec_.value, result.failure_class, result.message, repro,
                          example=self.outcome.examples, seconds=self.elapsed())
        entry = match(self.known_entries, self.label, case.mode.value, exec_.value, case.name, self.device_label,
                      case.dtype)
        if is_expected(entry, result):
            finding.known = entry.id
            count, first = self.outcome.known.get(entry.id, (0, finding))
            self.outcome.known[entry.id] = (count + 1, first)
            return None
        if entry is not None:
            finding.message = f"{against(entry, result)}; {finding.message}"
        if self.first_failure is None:
            self.first_failure, self.outcome.first_example = self.elapsed(), self.outcome.examples
        return finding


def fuzz(target: Target, budget: float, seed: Optional[int] = None, shrink_budget: Optional[float] = None,
         max_examples: int = 100_000, database: Optional[ExampleDatabase] = None,
         known: Sequence[KnownFailure] = (), running: Optional[Path] = None) -> Outcome:
    """Search `target` for `budget` seconds (or `max_examples` cases), then shrink each new
    failure for up to `shrink_budget` seconds (default: `budget`) from the first one found.
    `running`: where the case being run is kept while it runs (kit.fuzz.in_flight)."""
    seed = random.getrandbits(32) if seed is None else seed
    outcome = Outcome(seed=seed)
    search = _Search(target, known, budget, budget if shrink_budget is None else shrink_budget, outcome, running)
    namespace = f"{target.backend}/{'+'.join(m.value for m in target.modes)}/" \
                f"{'+'.join(e.value for e in target.execs)}/{target.size}"
    config = settings(database=Namespaced(database, namespace) if database is not None else None,
                      max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck),
                      verbosity=Verbosity.quiet, report_multiple_bugs=True, print_blob=False,
                      phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink))

    @hypothesis_seed(seed)
    @config
    @given(any_case(target.modes, target.size, Takes.of(search.caps)))
    def test(case):
        search.attempt(case)

    try:
        test()
    except (Unsatisfiable, OutOfTime):
        outcome.new = list(search.smallest.values())  # in the order first found
        outcome.shrunk = not outcome.new
    except KeyboardInterrupt:  # the user stops it: what was found so far is kept, unshrunk, in the ledger
        outcome.stopped = f"{INTERRUPTED} at example {outcome.examples}"
        outcome.new = list(search.smallest.values())
        outcome.shrunk = not outcome.new
    except Failed as err:
        outcome.new.append(err.finding)
    except BaseExceptionGroup as group:  # several distinct failures
        failed, rest = group.split(Failed)
        if rest is not None:
            raise rest
        outcome.new += [err.finding for err in _leaves(failed)]
    finally:  # the process lives on: no case took it down
        if running is not None:
            in_flight.clear(running)
    if not outcome.stopped:
        outcome.new = [search.without_unneeded_features(f) for f in outcome.new]
    end = search.elapsed()
    found = search.first_failure
    outcome.search_seconds = round(found if found is not None else end, 2)
    outcome.shrink_seconds = round(end - found, 2) if found is not None else 0.0
    return outcome


def shrink_features(target: Target, finding: Finding, known: Sequence[KnownFailure] = ()) -> Finding:
    """`finding` with every feature its failure does not need dropped, by runs of `target`'s backend
    (what `fuzz` does to each new failure it found)."""
    return _Search(target, known, 0, 0, Outcome(seed=0)).without_unneeded_features(finding)


def shrink(target: Target, finding: Finding) -> Finding:
    """`finding` shrunk by runs of `target`'s backend, each change kept where the case still fails the
    same way (mode, exec, failure class): the fewest requests, then the shortest lengths, then the
    fewest features. Every failure is shrunk, known ones too (a repro file is written for those)."""
    search = _Search(target, (), 0, 0, Outcome(seed=0))
    return search.without_unneeded_features(search.shorter(search.fewer_requests(finding)))


def first_failure(target: Target, case: Case, exec_: Exec) -> Optional[Finding]:
    """How `case` fails on `target`'s backend in `exec_` (known failure or not), or None where it passes."""
    return _Search(target, (), 0, 0, Outcome(seed=0))._run(case, exec_)


def _requests(case, kept: Sequence[int]) -> Dict:
    """The fields of `case` with only requests `kept`, each keeping its own data seed (a softmax case's) and
    accepted drafts (a recurrent verify's)."""
    changes = dict(prefix=tuple(case.prefix[i] for i in kept))
    if isinstance(case, Case):
        changes["request_seeds"] = tuple(case.request_seed(i) for i in kept)
    if not isinstance(case.new, int):
        changes["new"] = tuple(case.new[i] for i in kept)
    if getattr(case, "accepted", None) is not None:
        changes["accepted"] = tuple(case.accepted[i] for i in kept)
    return changes


def _lengths(case: Case, field: str) -> Optional[Tuple[int, ...]]:
    """Per request, the case's `field` lengths ("prefix" or "new"); None where `new` is one count for all."""
    value = getattr(case, field)
    return None if isinstance(value, int) else tuple(value)


def _leaves(group) -> List[Failed]:
    out = []
    for err in group.exceptions:
        out += _leaves(err) if isinstance(err, BaseExceptionGroup) else [err]
    return out
