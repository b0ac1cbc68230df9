"""Writing results files: one record per run (kit.report.record; kit.harness.environment adds
where, when and with what it ran). Files are written as the user's umask says (0644 under the
usual 022), as any file a command writes."""
from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path
from typing import Dict, List, Optional

from kit.report.record import SCHEMA

REPO = Path(__file__).resolve().parents[2]


def _sorted(records: List[Dict]) -> List[Dict]:
    return sorted(records, key=lambda r: (r["backend"], r["mode"], r["exec"], r["case"]))


def results_text(records: List[Dict], run: Optional[Dict] = None) -> str:
    """A results file's text: records in run-id order, keys sorted, so equal contents are equal bytes."""
    doc = {"schema": SCHEMA, "records": _sorted(records)}
    if run is not None:
        doc["run"] = run
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_text(path, text: str) -> None:
    """Atomic: readers never see a half-written file. Its mode is the umask's, not mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def page_path(results) -> str:
    """Where `python -m matrix html` writes without --out: beside the run's results file
    (results-local.json -> results-local.html, which git ignores as it ignores the results file),
    else matrix.html."""
    if not results:
        return "matrix.html"
    path = Path(results[0])
    return str(path.with_suffix(".html") if path.suffix == ".json" else path.with_name(path.name + ".html"))


def write_results(path: str, records: List[Dict], run: Optional[Dict] = None) -> None:
    """`run`: what the session selected and how it ended (kit.report.record.ResultsFile's status,
    selected, catalog)."""
    write_text(path, results_text(records, run))


# A growing file ends with this after every append; the next record goes in its place.
_TAIL = b"\n]}\n"


class GrowingResults:
    """A results file written as a session runs, in time linear in its records: `start` writes
    the run section and no record, `append` adds a record in place of the file's closing bytes
    (one write: the file is whole JSON after each, whenever the process dies), `finish` writes it
    sorted, whole (results_text)."""

    def __init__(self, path):
        self.path = Path(path)
        self.count = 0
        self.lock = threading.Lock()  # a watchdog thread may finish it while a run is stuck

    def start(self, run: Dict) -> None:
        with self.lock:
            head = json.dumps({"run": run, "schema": SCHEMA}, sort_keys=True)[:-1]
            write_text(self.path, f'{head}, "records": [' + _TAIL.decode())
            self.count = 0

    def append(self, record: Dict) -> None:
        with self.lock:
            piece = (b",\n" if self.count else b"\n") + json.dumps(record, sort_keys=True).encode() + _TAIL
            with open(self.path, "r+b") as f:
                f.seek(-len(_TAIL), os.SEEK_END)
                f.write(piece)
            self.count += 1

    def finish(self, records: List[Dict], run: Dict) -> None:
        with self.lock:
            write_results(self.path, records, run)
            self.count = len(records)
