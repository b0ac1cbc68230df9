"""The run record and its vocabulary, free of torch and of the engine: the report
layer (matrix/, KNOWN_FAILURES.md) reads results through this module alone."""
from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from kit.shard import Shard

# Outcomes of a run.
PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
# Failure classes: where to look.
KERNEL, GRAPH, KV_WRITE, CRASH = "kernel", "graph", "kv-write", "crash"
FAILURE_CLASSES = (KERNEL, GRAPH, KV_WRITE, CRASH)
# A run its environment stopped before a verdict (the kit out of device memory in its own
# allocations, after releasing what it keeps and retrying): no verdict on the backend, so
# tables do not count it against the backend, and the gate takes no results file holding one
# (run it again). Never a known failure.
ERROR, ENVIRONMENT = "error", "environment"
OUTCOMES = (PASS, FAIL, UNSUPPORTED, ERROR)
# How a run executed: eager, a real CUDA graph, the graph protocol without CUDA, or an
# EXTEND graph run whose padded call ran eagerly (the backend does not capture EXTEND).
EAGER, CUDA_GRAPH, EMULATED, PIECEWISE_EAGER = "eager", "cuda-graph", "emulated", "piecewise-eager"
# Cells of these runs do not prove what a real captured graph proves: tables say so.
WEAKER_THAN_A_GRAPH = (EMULATED, PIECEWISE_EAGER)


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

    @property
    def test_id(self) -> str:
        return run_id(self.backend, self.mode, self.exec, self.case)


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
SCHEMA = 2


def record_id(record: Dict) -> str:
    return run_id(record["backend"], record["mode"], record["exec"], record["case"])


def verdict(record: Dict) -> str:
    """`pass`, `unsupported`, or `fail [class]`: what two runs must agree on."""
    return record["outcome"] + (f" [{record['failure_class']}]" if record.get("failure_class") else "")


def repro_command(backend: str, mode: str, exec_: str, case: str, catalog: Optional[str] = None,
                  timeout: Optional[float] = None, case_line: Optional[str] = None) -> str:
    """The one-line command that re-runs a run (the catalog named only when not the default; the
    time limit for a run that ran out of it, which the same limit reproduces); a case in no catalog
    (a fuzzed one) is given whole, as its `Case(...)` line (kit.engine.case_line)."""
    if case_line:
        args = ["--backend", backend, "--exec", exec_, "--case-line", case_line]
    else:
        args = ["--backend", backend, "--mode", mode, "--exec", exec_, "--case", case]
    if catalog and not case_line:
        args += ["--cases", catalog]
    if timeout:
        args += ["--timeout", f"{timeout:g}"]
    return "python -m kit run " + " ".join(shlex.quote(a) for a in args)


# A results file's `run`: what the session selected and how it ended. `running` while it writes
# as it goes (a process killed mid-run leaves that), `interrupted` when it ended early.
COMPLETE, INTERRUPTED, RUNNING = "complete", "interrupted", "running"


class ResultsError(ValueError):
    """A results file that cannot be read; one line: the path, the problem, the fix."""


@dataclasses.dataclass
class ResultsFile:
    path: str
    records: List[Dict]
    status: str = COMPLETE
    # Run ids this session selected, and every run id the catalog has for its case set and the
    # registered backends. None: not recorded (files written before the `run` section).
    selected: Optional[List[str]] = None
    catalog: Optional[List[str]] = None
    shard: Optional[Shard] = None  # a `--shard K/N` run's: which part of which selection it holds

    @property
    def has_run_list(self) -> bool:
        return self.selected is not None and self.catalog is not None

    def missing(self, wanted: Optional[List[str]]) -> List[str]:
        """Run ids of `wanted` without a record here."""
        have = {record_id(r) for r in self.records}
        return [rid for rid in wanted or [] if rid not in have]

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
    if not isinstance(records, list) or not all(isinstance(r, dict) and _RECORD_KEYS <= set(r) for r in records):
        raise ResultsError(f"{path}: records missing or malformed (each needs {', '.join(sorted(_RECORD_KEYS))}); {fix}")
    bad = [r for r in records if _vocabulary_problem(r)]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ResultsError(f"{path}: record {record_id(bad[0])}: {_vocabulary_problem(bad[0])}{more}; {fix}")
    try:
        shard = None if run.get("shard") is None else Shard.from_section(run["shard"])
    except ValueError as exc:
        raise ResultsError(f"{path}: {exc}; {fix}") from None
    return ResultsFile(str(path), records, run.get("status", COMPLETE), run.get("selected"), run.get("catalog"), shard)


_RECORD_KEYS = {"backend", "mode", "exec", "case", "outcome", "device"}


def _vocabulary_problem(record: Dict) -> str:
    """Why a record's outcome or failure class is outside the vocabulary above, or ''."""
    if record["outcome"] not in OUTCOMES:
        return f"outcome {record['outcome']!r} is not one of {', '.join(OUTCOMES)}"
    if record["outcome"] == FAIL and record.get("failure_class") not in FAILURE_CLASSES:
        return f"failure class {record.get('failure_class')!r} is not one of {', '.join(FAILURE_CLASSES)}"
    return ""


def read_results(path) -> List[Dict]:
    """The records of a results file (see read_results_file)."""
    return read_results_file(path).records
