"""The fuzz ledger: one JSON line per fuzz run (what was searched, the seed, how many examples,
how long, what failed), appended to `results/fuzz/ledger.jsonl` of the working directory or
another path. Torch-free: the report layer can read it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

DEFAULT = Path("results") / "fuzz" / "ledger.jsonl"


class LedgerError(ValueError):
    """A ledger line that cannot be read; one line: the path and line, the problem, the fix."""


def append(path, record: Dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def read(path) -> List[Dict]:
    records = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise LedgerError(f"{path}:{n}: not a ledger line ({exc.msg}); remove the line (a run cut off "
                              f"while writing?)") from None
    return records
