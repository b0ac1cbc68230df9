"""The fuzz ledger: one JSON line per fuzz run (what was searched, the seed, how many examples,
how long, what failed), appended to `results/fuzz/ledger.jsonl` of the working directory for
the kit's own backends (the checkout's ledger is tracked), to the user's cache for any other
(fuzzing one's own backend leaves the checkout as it was), or to another path. Torch-free: the
report layer can read it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

DEFAULT = Path("results") / "fuzz" / "ledger.jsonl"
OTHERS = Path("~/.cache/attention-conformance-kit/fuzz-ledger.jsonl")


def default(in_box: bool) -> Path:
    """The ledger of a fuzz run given none: the kit's own for its own backends, the cache's else."""
    return DEFAULT if in_box else OTHERS.expanduser()


def append(path, record: Dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path

