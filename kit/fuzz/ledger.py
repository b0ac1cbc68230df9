"""The fuzz ledger: one JSON line per fuzz run (what was searched, the seed, how many examples,
how long, what failed), appended to `results/fuzz/ledger.jsonl` of the working directory or
another path. Torch-free: the report layer can read it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

DEFAULT = Path("results") / "fuzz" / "ledger.jsonl"


def append(path, record: Dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path

