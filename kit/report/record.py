"""The run record and its vocabulary, free of torch and of the engine: the report
layer (matrix/, KNOWN_FAILURES.md) reads results through this module alone."""
from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from kit.modes import EXECS, MODES
from kit.shard import Shard

# Outcomes of a run.
PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
# Failure classes: where to look.
KERNEL, GRAPH, KV_WRITE, CRASH = "kernel", "graph", "kv-write", "crash"
FAILURE_CLASSES = (KERNEL, GRAPH, KV_WRITE, CRASH)
# A run stopped before a verdict: by its environment (the kit out of device memory in its own
# allocations, after releasing what it keeps and retrying), or by the kit itself raising (a bug of
# the kit, as the fuzzer finds on a drawn case). No verdict on the backend, so tables do not count
# it against the backend, and the gate takes no results file holding one (run it again). Never a
# known failure.
ERROR, ENVIRONMENT, KIT_ERROR = "error", "environment", "kit-error"
ERROR_CLASSES = (ENVIRONMENT, KIT_ERROR)
OUTCOMES = (PASS, FAIL, UNSUPPORTED, ERROR)
# How a run executed: eager, a real CUDA graph, the graph protocol without CUDA, or an
# EXTEND graph run whose padded call ran eagerly (the backend does not capture EXTEND).
EAGER, CUDA_GRAPH, EMULATED, PIECEWISE_EAGER = "eager", "cuda-graph", "emulated", "piecewise-eager"
EXEC_DETAILS = (EAGER, CUDA_GRAPH, EMULATED, PIECEWISE_EAGER)
# Cells of these runs do not prove what a real captured graph proves: tables say so.
WEAKER_THAN_A_GRAPH = (EMULATED, PIECEWISE_EAGER)
MODE_VALUES, EXEC_VALUES = tuple(m.value for m in MODES), tuple(e.value for e in EXECS)


@dataclasses.dataclass
class RunResult:
    backend: str
    mode: str
    exec: str
    case: str
    dtype: str
    outcome: str
    failure_class: Optional[str] = None
    message: str = ""
    max_err: Optional[float] = None
    tol: Optional[float] = None
    exec_detail: str = ""  # EAGER | CUDA_GRAPH | EMULATED | PIECEWISE_EAGER
    seconds: float = 0.0
    repro: str = ""
    isolated: bool = False  # ran in a subprocess (a quarantined known failure)
    device_lost: bool = False  # a sticky device fault: this process can run nothing more on the device
    versions: Dict[str, str] = dataclasses.field(default_factory=dict)  # torch, cuda, the backend's libraries
    # The numerics the outputs were judged under: "exact", or the steps of the backend's declared numerics
    # the run took (kit.engine.numerics, e.g. "q fp8, new tokens as handed"); "" where nothing was judged.
    numerics: str = ""
    # Per layer id, the worst output's error over its limit, by either rule (kit.harness.checks.OutputCheck.excess,
    # over every batch and step): > 1 fails; empty where no output was judged.
    margins: List[float] = dataclasses.field(default_factory=list)

    @property
    def exact(self) -> bool:
        """Judged against the exact float64 reference (no declared rounding step taken)."""
        return self.numerics in ("", EXACT)

    @property
    def test_id(self) -> str:
        return run_id(self.backend, self.mode, self.exec, self.case)

    @property
    def verdict(self) -> str:
        """`pass`, `unsupported`, or `fail [class]`: what two runs must agree on."""
        return self.outcome + (f" [{self.failure_class}]" if self.failure_class else "")


def run_id(backend: str, mode: str, exec_: str, case: str) -> str:
    """The id of one run in test ids, messages and tables (mode, exec and case names hold no '-')."""
    return f"{backend}-{mode}-{exec_}-{case}"


def parse_run_id(text: str) -> Tuple[str, str, str, str]:
    """(backend, mode, exec, case) of a run id; the backend label may itself hold '-'."""
    parts = text.rsplit("-", 3)
    if len(parts) != 4:
        raise ValueError(f"{text!r} is not a run id (backend-mode-exec-case)")
    return parts[0], parts[1], parts[2], parts[3]


# Fields every record carries besides the RunResult's: where and when it ran.
ENVIRONMENT_FIELDS = ("device", "kit_commit", "date")
# Fields a results file may leave out: what differs from one run of the same code to the next
# (matrix.committed drops them from the committed files).
VOLATILE = ("seconds", "date", "kit_commit")
# Fields records written before them lack; the committed form leaves them out where they hold their default.
LATER = {"numerics": "", "margins": []}
EXACT = "exact"  # kit.engine.numerics.EXACT: the report layer reads no engine module
SCHEMA = 2


class RecordError(ValueError):
    """A record outside the record's form or vocabulary; the message says which field and why."""


@dataclasses.dataclass
class Record(RunResult):
    """A run's record as a results file holds it: its RunResult and where it ran. What the report
    layer (tables, gate, HTML, known failures) reads, never the file's dicts."""

    device: str = ""
    kit_commit: str = ""
    date: str = ""

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d) -> "Record":
        """The record `d` holds, or RecordError: a field missing (only VOLATILE ones may be) or not
        the record's, an outcome, failure class, mode, exec or exec detail outside the vocabulary."""
        if not isinstance(d, dict):
            raise RecordError(f"a {type(d).__name__}, not a record")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in d and n not in VOLATILE and n not in LATER]
        stray = sorted(set(d) - set(names))
        if missing or stray:
            raise RecordError("; ".join(filter(None, (missing and f"missing {', '.join(missing)}",
                                                      stray and f"fields no record has: {', '.join(stray)}"))))
        record = cls(**d)
        problem = _vocabulary_problem(record)
        if problem:
            raise RecordError(problem)
        return record


def _vocabulary_problem(r: Record) -> str:
    """Why a record's values are outside the vocabulary above, or ''."""
    if not all(isinstance(v, str) and v for v in (r.backend, r.case, r.dtype, r.device)):
        return "backend, case, dtype and device must be names"
    for field, allowed in (("mode", MODE_VALUES), ("exec", EXEC_VALUES), ("outcome", OUTCOMES)):
        if getattr(r, field) not in allowed:
            return f"{field} {getattr(r, field)!r} is not one of {', '.join(allowed)}"
    classes = {FAIL: FAILURE_CLASSES, ERROR: ERROR_CLASSES}.get(r.outcome, (None,))
    if r.failure_class not in classes:
        return (f"failure class {r.failure_class!r} of a run with outcome {r.outcome} is not one of "
                f"{', '.join(map(str, classes))}")
    if r.exec_detail not in EXEC_DETAILS + ("",):
        return f"exec detail {r.exec_detail!r} is not one of {', '.join(EXEC_DETAILS)} or empty"
    if not isinstance(r.versions, dict):
        return "versions must map library names to versions"
    return ""


def repro_command(backend: str, mode: str, exec_: str, case: str, catalog: Optional[str] = None,
                  timeout: Optional[float] = None, case_line: Optional[str] = None,
                  pythonpath: Optional[str] = None) -> str:
    """The one-line command that re-runs a run (the catalog named only when not the default; the
    time limit for a run that ran out of it, which the same limit reproduces); a case in no catalog
    (a fuzzed one) is given whole, as its `Case(...)` line (kit.engine.case_line); `pythonpath`: the
    folder a backend outside the kit and the installed packages is imported from (a fresh shell
    has no other way to find it)."""
    if case_line:
        args = ["--backend", backend, "--exec", exec_, "--case-line", case_line]
    else:
        args = ["--backend", backend, "--mode", mode, "--exec", exec_, "--case", case]
    if catalog and not case_line:
        args += ["--cases", catalog]
    if timeout:
        args += ["--timeout", f"{timeout:g}"]
    prefix = f"PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else ""
    return prefix + "python -m kit run " + " ".join(shlex.quote(a) for a in args)


# A results file's `run`: what the session selected and how it ended. `running` while it writes
# as it goes (a process killed mid-run leaves that), `interrupted` when it ended early.
COMPLETE, INTERRUPTED, RUNNING = "complete", "interrupted", "running"
STATUSES = (COMPLETE, INTERRUPTED, RUNNING)


class ResultsError(ValueError):
    """A results file that cannot be read; one line: the path, the problem, the fix."""


@dataclasses.dataclass(frozen=True)
class Rerun:
    """Backends whose records a merged run took from a whole run of them made after its shards (the
    kit's fix of its own backend, or runs their environment stopped): the file's records of these
    backends were judged at `kit_commit`, its others at the shards' commit."""

    backends: Tuple[str, ...]
    kit_commit: str

    def section(self) -> dict:
        return {"backends": sorted(self.backends), "kit_commit": self.kit_commit}

    @classmethod
    def from_section(cls, section) -> "Rerun":
        """A results file's `reruns` entry; ValueError where it is not one."""
        if not (isinstance(section, dict) and set(section) == {"backends", "kit_commit"}
                and isinstance(section["kit_commit"], str) and isinstance(section["backends"], list)
                and section["backends"] and all(isinstance(b, str) for b in section["backends"])):
            raise ValueError(f"its run's rerun {section!r} is not the backends and kit_commit of a "
                             f"`matrix merge --rerun`")
        return cls(tuple(section["backends"]), section["kit_commit"])


@dataclasses.dataclass
class ResultsFile:
    path: str
    records: List[Record]
    status: str = COMPLETE
    # Run ids this session selected, and every run id the catalog has for its case set and the
    # registered backends. None: not recorded (files written before the `run` section).
    selected: Optional[List[str]] = None
    catalog: Optional[List[str]] = None
    shard: Optional[Shard] = None  # a `--shard K/N` run's: which part of which selection it holds
    reruns: List[Rerun] = dataclasses.field(default_factory=list)  # a merged run's backends run again

    def run_section(self) -> Dict:
        """The file's `run`, as written (run ids sorted: equal runs are equal bytes)."""
        run = dict(status=self.status, selected=sorted(self.selected), catalog=sorted(self.catalog))
        if self.shard is not None:
            run["shard"] = self.shard.section()
        if self.reruns:
            run["reruns"] = [r.section() for r in self.reruns]
        return run

    @property
    def has_run_list(self) -> bool:
        return self.selected is not None and self.catalog is not None

    def missing(self, wanted: Optional[List[str]]) -> List[str]:
        """Run ids of `wanted` without a record here."""
        have = {r.test_id for r in self.records}
        return [rid for rid in wanted or [] if rid not in have]

    def incomplete(self) -> str:
        """Why the file is not a whole run of what its session selected, or '': `interrupted run
        (status): N of M selected runs recorded (first missing: ...)`."""
        if not self.has_run_list:
            return ""
        missing = self.missing(self.selected)
        if self.status == COMPLETE and not missing:
            return ""
        first = f" (first missing: {missing[0]}{' ...' if len(missing) > 1 else ''})" if missing else ""
        return (f"interrupted run ({self.status}): {len(self.selected) - len(missing)} of {len(self.selected)} "
                f"selected runs recorded{first}")

    def not_selected(self) -> set:
        """Catalog runs this session left out on purpose (narrowed by options)."""
        return set(self.catalog or []) - set(self.selected or [])


def read_results_file(path) -> ResultsFile:
    """A results file written by kit.report.results.write_results, or ResultsError saying what is wrong."""
    p = Path(path)
    fix = "regenerate it with `python -m pytest ... --results-json` (docs/running.md, 'The results file')"
    if not p.exists():
        raise ResultsError(f"{path}: no such results file; check the path (a run writes it with --results-json)")
    if not p.is_file():
        raise ResultsError(f"{path}: is a directory, not a results file; name the .json file in it")
    try:
        doc = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path}: not a results file (bad JSON: {exc}; truncated?); {fix}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        schema = doc.get("schema") if isinstance(doc, dict) else None
        raise ResultsError(f"{path}: results schema {schema!r}, expected {SCHEMA}; {fix}")
    records, run = doc.get("records"), doc.get("run", {})
    if not isinstance(records, list):
        raise ResultsError(f"{path}: no list of records; {fix}")
    read, bad = [], []
    for n, d in enumerate(records):
        try:
            read.append(Record.from_dict(d))
        except (RecordError, TypeError) as exc:
            bad.append(f"record {n + 1}{_named(d)}: {exc}")
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ResultsError(f"{path}: {bad[0]}{more}; {fix}")
    if not isinstance(run, dict) or run.get("status", COMPLETE) not in STATUSES:
        raise ResultsError(f"{path}: its `run` has no status of {', '.join(STATUSES)}; {fix}")
    try:
        shard = None if run.get("shard") is None else Shard.from_section(run["shard"])
        reruns = [Rerun.from_section(r) for r in _list(run.get("reruns", []), "reruns")]
    except ValueError as exc:
        raise ResultsError(f"{path}: {exc}; {fix}") from None
    return ResultsFile(str(path), read, run.get("status", COMPLETE), run.get("selected"), run.get("catalog"), shard,
                       reruns)


def _list(value, field: str) -> list:
    """`value` where it is a list, else ValueError naming the run's field."""
    if not isinstance(value, list):
        raise ValueError(f"its run's {field} is {value!r}, not a list")
    return value


def _named(d) -> str:
    """` (its run id)` where the record names one."""
    try:
        return f" ({run_id(d['backend'], d['mode'], d['exec'], d['case'])})"
    except (KeyError, TypeError):
        return ""
