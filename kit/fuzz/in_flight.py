"""The case a fuzz process is running, on disk while it runs. A backend that takes the process
down (a segfault, an abort) ends the search before any report; this file then names the case
that did it. Written before each run, removed when the search ends; found by the next fuzz
process (or by the mutant table's, which started the one that died), it is that case's crash,
not shrunk. Torch-free."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Optional

NAME = "in-flight.json"  # beside the ledger (kit.fuzz.ledger), unless named


def write(path, record: Dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(record, sort_keys=True))
    os.replace(part, path)  # whole or not at all, whenever the process dies


def clear(path) -> None:
    Path(path).unlink(missing_ok=True)


def take(path) -> Optional[Dict]:
    """The case a fuzz process was running when it died, or None; the file is removed."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    clear(path)
    return record


def said(record: Dict) -> str:
    return (f"the fuzz process before this one died running {record['backend']} {record['exec']} "
            f"(example {record['example']}, {record['seconds']:g} s into its search): {record['case_line']}; "
            f"repro: {record['repro']}")
