"""The run record and its vocabulary, free of torch and of the engine: the report
layer (matrix/, KNOWN_FAILURES.md) reads results through this module alone."""
from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Dict, List, Optional, Tuple

# Outcomes of a run.
PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
# Failure classes: where to look.
KERNEL, GRAPH, KV_WRITE, CRASH = "kernel", "graph", "kv-write", "crash"
FAILURE_CLASSES = (KERNEL, GRAPH, KV_WRITE, CRASH)
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


def repro_command(backend: str, mode: str, exec_: str, case: str, catalog: Optional[str] = None) -> str:
    """The one-line command that re-runs a run (the catalog named only when not the default)."""
    args = ["--backend", backend, "--mode", mode, "--exec", exec_, "--case", case]
    if catalog:
        args += ["--cases", catalog]
    return "python -m kit run " + " ".join(shlex.quote(a) for a in args)


def read_results(path) -> List[Dict]:
    """The records of a results file written by kit.results.write_results."""
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: results schema {doc.get('schema')!r}, expected {SCHEMA}; "
                         f"regenerate it with this kit")
    return doc["records"]
