"""Writing results files: one record per run (kit.report.record; kit.harness.environment adds
where, when and with what it ran)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from kit.report.record import SCHEMA

REPO = Path(__file__).resolve().parents[2]


def results_text(records: List[Dict], run: Optional[Dict] = None) -> str:
    """A results file's text: records in run-id order, keys sorted, so equal contents are equal bytes."""
    doc = {"schema": SCHEMA, "records": sorted(records, key=lambda r: (r["backend"], r["mode"], r["exec"], r["case"]))}
    if run is not None:
        doc["run"] = run
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_text(path, text: str) -> None:
    """Atomic: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_results(path: str, records: List[Dict], run: Optional[Dict] = None) -> None:
    """`run`: what the session selected and how it ended (kit.report.record.ResultsFile's status,
    selected, catalog)."""
    write_text(path, results_text(records, run))
